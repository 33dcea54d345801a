"""The structure ARCHITECTURE.md asks for, checked on the source tree: the agent loop lives in the
pyo3-free core (``src/agent_loop/``), the binding imports Python only for values (classes,
sentinels) and reads no private attribute of a Python object, and the machine has Rust tests of
its own. A change that moves a loop rule back into the binding, or reaches into ``AgentLoop``'s
privates from native code, fails here. So does a component that leaves its folder (the inbox with
its projection, the PostgreSQL runtime thread with its reconnects, the binding's inbox and
runtime, each mirroring what it wraps) or an old file left behind."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
CORE = ROOT / "src" / "agent_loop"
BINDING = ROOT / "src" / "python"

# The kerman modules the binding may import, for classes only (payloads, decisions, Signal,
# exceptions, the native module's own classes, the event views the log's readers hand out with
# `view=True`), and kerman._html: presentation only (the HTML views of `_repr_html_`, which hold
# no loop rule), imported by src/python/html.rs alone.
VALUE_MODULES = {"kerman.types", "kerman.errors", "kerman._core", "kerman._html", "kerman.events", "kerman.decisions"}

# Each component's folder and the files it holds.
FOLDERS = {
    "src/inbox": ("mod.rs", "splice.rs", "projection.rs"),
    "src/event_log/postgres/worker": ("mod.rs", "pool.rs", "reconnect.rs", "recover.rs"),
    "src/python/inbox": ("mod.rs", "identity.rs", "callbacks.rs", "projection.rs"),
    "src/python/runtime": ("mod.rs", "aio.rs", "coroutine.rs", "doorbell.rs", "exit.rs", "gil.rs"),
    "src/python/agent_loop": ("mod.rs", "run.rs", "driver.rs", "tools.rs"),
    "src/python/event_log": ("mod.rs", "event.rs", "iter.rs", "tail.rs"),
}

# The files those folders replaced.
GONE = (
    "src/projection.rs",
    "src/event_log/postgres/worker.rs",
    "src/event_log/postgres/reconnect.rs",
    "src/event_log/postgres/recover.rs",
    "src/python/inbox.rs",
    "src/python/projection.rs",
    "src/python/aio.rs",
    "src/python/doorbell.rs",
    "src/python/exit.rs",
    "src/python/event_log.rs",
)


def _rust(folder: Path):
    files = sorted(folder.rglob("*.rs"))
    assert files, f"no Rust files under {folder}"
    return [(f, f.read_text()) for f in files]


def test_the_turn_machine_has_no_pyo3():
    offenders = [str(f.relative_to(ROOT)) for f, text in _rust(CORE) if re.search(r"\bpyo3\b", text)]
    assert offenders == []


def test_the_binding_imports_kerman_modules_only_for_values():
    imported = set()
    for _, text in _rust(BINDING):
        imported.update(re.findall(r'import\("(kerman[\w.]*)"\)', text))
    assert imported and imported <= VALUE_MODULES, imported - VALUE_MODULES
    html = [path for path, text in _rust(BINDING) if 'import("kerman._html")' in text]
    assert [p.name for p in html] == ["html.rs"], html


def test_the_loops_binding_reads_no_private_attribute():
    # A single leading underscore names a private attribute; dunders are protocol.
    private = re.compile(r'(?:intern!\(py, |getattr(?:_opt)?\(|setattr\(|call_method[01]?\()"(_[a-z][\w]*)"')
    found = {m.group(1) for _, text in _rust(BINDING / "agent_loop") for m in private.finditer(text)}
    assert found == set()


def test_the_python_side_has_no_loop_modules_left():
    package = ROOT / "python" / "kerman"
    assert not (package / "_turn.py").exists() and not (package / "_tools.py").exists()
    imports = [line for f in package.glob("*.py") for line in f.read_text().splitlines() if line.startswith(("import ", "from "))]
    assert [line for line in imports if re.search(r"\b_(turn|tools)\b", line)] == []


def test_the_machine_has_rust_tests_of_its_own():
    text = (ROOT / "tests" / "rust" / "agent_loop.rs").read_text()
    assert text.count("#[test]") >= 40
    assert "mod agent_loop;" in (ROOT / "tests" / "rust" / "main.rs").read_text()


def test_each_component_has_its_folder():
    missing = [f"{folder}/{name}" for folder, names in FOLDERS.items() for name in names if not (ROOT / folder / name).is_file()]
    assert missing == []


def test_the_files_the_folders_replaced_are_gone():
    assert [path for path in GONE if (ROOT / path).exists()] == []


def test_the_gil_release_hook_lives_in_the_runtime():
    assert "fn release_gil_while" in (BINDING / "runtime" / "gil.rs").read_text()
    assert "fn release_gil_while" not in (BINDING / "mod.rs").read_text()


def test_the_driver_and_the_tool_runs_do_not_use_each_other():
    """Both build on the run's types (``run.rs``): the driver's and the tools' modules form a
    tree, not a cycle."""
    folder = BINDING / "agent_loop"
    uses = {name: re.findall(r"super::(driver|tools)\b", (folder / f"{name}.rs").read_text()) for name in ("driver", "tools", "run")}
    assert uses == {"driver": [], "tools": [], "run": []}
