"""What `import kerman` shows a user: dir(kerman) holds only the public API and the package's
own modules, LiveEvent's fields show in dir() (completion in Jupyter), and the package
docstring links to the project's documentation."""

import re
import types

import kerman
from kerman import LiveEvent


def test_dir_kerman_holds_only_public_names() -> None:
    leaked = []
    for name in dir(kerman):
        if name.startswith("_") or name in kerman.__all__:
            continue
        value = getattr(kerman, name)
        # A submodule of the package (kerman.loop, kerman.types, ...) is bound by Python's
        # import system itself; anything else not in __all__ is a leak.
        if isinstance(value, types.ModuleType) and value.__name__ == f"kerman.{name}":
            continue
        leaked.append(name)
    assert leaked == []


def test_package_docstring_links_to_the_docs() -> None:
    doc = kerman.__doc__ or ""
    urls = re.findall(r"https?://\S+", doc)
    assert urls, doc
    for url in urls:
        assert url.rstrip(").,") == "https://github.com/kerman-project/kerman/tree/main/docs", url


def test_live_event_fields_show_in_dir() -> None:
    live = LiveEvent("agent/error", None, turn=3, step=1, error="boom")  # type: ignore[arg-type]
    names = dir(live)
    for field in ("type", "loop", "turn", "step", "error"):
        assert field in names, (field, names)
    assert live.turn == 3 and live.error == "boom"
