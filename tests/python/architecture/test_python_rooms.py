"""The Python package's rooms, checked on the source tree: tools in ``kerman/tools/``, the command
line in ``kerman/cli/``, the signal and the seams' shapes in modules of their own, the files they
replaced gone, and no import cycle between the package's modules (an import inside a function
counts: a cycle broken by a lazy import is still a cycle; imports under ``TYPE_CHECKING`` do not)."""

import ast
import warnings
from pathlib import Path
from typing import Dict, List, Set

ROOT = Path(__file__).resolve().parents[3]
PACKAGE = ROOT / "python" / "kerman"
NATIVE = {"kerman._core"}  # the extension module: no Python source

ROOMS = {
    "tools": (
        "__init__.py",
        "_tool.py",
        "_context.py",
        "_convert.py",
        "_infer.py",
        "_docstring.py",
        "_typed.py",
        "_check.py",
        "_executor.py",
    ),
    "cli": (
        "__init__.py",
        "_main.py",
        "_common.py",
        "_log.py",
        "_timeline.py",
        "_workers.py",
        "_usage.py",
        "_otel.py",
        "chat.py",
        "_chat_screen.py",
        "_chat_decide.py",
        "_doubt.py",
        "demo.py",
    ),
}
MODULES = ("signal.py", "hooks.py", "types.py")
GONE = ("cli.py", "_schema.py", "_executor.py", "_timeline.py", "_workers_cli.py")


def _name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(path: Path, known: Set[str]) -> Set[str]:
    name = _name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: Set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.add(sub if sub in known else target)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    with warnings.catch_warnings():  # a docstring's escape warns when compiled, not here
        warnings.simplefilter("ignore")
        tree = ast.parse(path.read_text(encoding="utf-8"))
    visit(tree)
    return {m for m in found if m in known and m != name}


def _cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    found: List[List[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return found


def test_the_package_has_no_import_cycle() -> None:
    files = sorted(PACKAGE.rglob("*.py"))
    known = {_name(f) for f in files} | NATIVE
    graph = {_name(f): _imports(f, known) for f in files}
    graph.update({m: set() for m in NATIVE})
    assert graph["kerman.tools._tool"] >= {"kerman.tools._typed", "kerman.tools._check"}  # the reader sees imports
    assert _cycles(graph) == []


def test_a_cycle_is_found_when_there_is_one() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_rooms_hold_their_files_and_the_old_files_are_gone() -> None:
    for room, names in ROOMS.items():
        assert sorted(p.name for p in (PACKAGE / room).glob("*.py")) == sorted(names), room
    assert [m for m in MODULES if not (PACKAGE / m).is_file()] == []
    assert [g for g in GONE if (PACKAGE / g).exists()] == []
