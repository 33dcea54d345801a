"""The crate's layering, checked on the source tree: `src/lib.rs` writes the layer order on one
line (``Layer order: json, ids, blocking → message → event_log → ...``), and every ``crate::``
path under ``src/`` (``use crate::x``, ``use crate::{x, y}`` and inline ``crate::x::f()``) must
point from a module to one of an earlier layer. Storage calling the loop, the inbox re-exporting a
loop fold, or a new top-level module nobody placed in the order fails here."""

import re
from pathlib import Path
from typing import Dict, List, Tuple

ROOT = Path(__file__).resolve().parents[3]
SRC = ROOT / "src"

_ORDER_LINE = re.compile(r"^//! Layer order: (.+)$", re.MULTILINE)
# `crate::name` anywhere, and the names of a `crate::{a, b::c}` group.
_PATH = re.compile(r"\bcrate::(\w+)")
_GROUP = re.compile(r"\bcrate::\{([^}]*)\}")
_COMMENT = re.compile(r"//.*$", re.MULTILINE)


def layer_order(src: Path) -> Dict[str, int]:
    """Each top-level module's layer, from the order line of `src/lib.rs` (lowest is 0)."""
    found = _ORDER_LINE.findall((src / "lib.rs").read_text())
    assert len(found) == 1, "src/lib.rs must write the layer order on exactly one line"
    layers = [[name.strip() for name in layer.split(",")] for layer in found[0].split("→")]
    return {name: rank for rank, layer in enumerate(layers) for name in layer}


def _module_of(path: Path, src: Path) -> str:
    return path.relative_to(src).parts[0].removesuffix(".rs")


def _used(text: str) -> List[str]:
    code = _COMMENT.sub("", text)
    names = _PATH.findall(code)
    for group in _GROUP.findall(code):
        names += [item.strip().split("::")[0] for item in group.split(",") if item.strip()]
    return names


def arrows_against(src: Path) -> List[Tuple[str, str, str]]:
    """Every `(file, from, to)` whose `crate::` path points to the same or a later layer."""
    order = layer_order(src)
    wrong = []
    for path in sorted(src.rglob("*.rs")):
        if path == src / "lib.rs":
            continue
        module = _module_of(path, src)
        for used in _used(path.read_text()):
            if used != module and order[used] >= order[module]:
                wrong.append((str(path.relative_to(src)), module, used))
    return sorted(set(wrong))


def test_every_top_level_module_has_a_layer():
    modules = {_module_of(path, SRC) for path in SRC.rglob("*.rs")} - {"lib"}
    assert modules - set(layer_order(SRC)) == set()
    assert set(layer_order(SRC)) - modules == set()


def test_no_crate_path_points_against_the_layer_order():
    assert arrows_against(SRC) == []


def test_the_check_sees_the_arrows_it_forbids(tmp_path):
    src = tmp_path / "src"
    (src / "event_log").mkdir(parents=True)
    (src / "lib.rs").write_text("//! Layer order: json → event_log → agent_loop\n")
    (src / "json.rs").write_text("// crate::agent_loop in a comment is no arrow\n")
    (src / "agent_loop.rs").write_text("use crate::{event_log::Event, json};\n")
    (src / "event_log" / "memory.rs").write_text("fn f() { crate::agent_loop::close(); }\nuse crate::{json, agent_loop::X};\n")
    assert arrows_against(src) == [("event_log/memory.rs", "event_log", "agent_loop")]
