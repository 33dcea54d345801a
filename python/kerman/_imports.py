"""``MODULE:NAME`` on the command line (``kerman chat --model``, ``kerman serve --model``,
``kerman worker --app``): the object it names, or a ``ValueError`` saying what is wrong."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

__all__ = ["load_object"]


class _BadSpec(ValueError):
    """What is wrong with the spec itself (not an error the module raised while importing)."""


def load_object(spec: str, flag: str) -> Any:
    """``pkg.module:name`` (``name`` may be dotted) or ``path/to/file.py:name``. The current
    folder is importable, as with ``python -m``. Errors name ``flag`` and ``spec``."""
    module_name, sep, attr = spec.rpartition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"{flag} must look like MODULE:NAME (e.g. kerman.models:EchoModel), got {spec!r}")
    try:
        module = _load_module(module_name, flag, spec)
    except _BadSpec:
        raise
    except Exception as error:  # the module's own error (a typo, a missing dependency) is the news
        raise ValueError(f"{flag} {spec!r}: cannot import {module_name!r}: {type(error).__name__}: {error}") from error
    value = module
    for part in attr.split("."):
        try:
            value = getattr(value, part)
        except AttributeError:
            raise ValueError(f"{flag} {spec!r}: {module_name!r} has no {attr!r}") from None
    return value


def _load_module(module_name: str, flag: str, spec: str) -> Any:
    if not module_name.endswith(".py"):
        if os.getcwd() not in sys.path and "" not in sys.path:
            sys.path.insert(0, os.getcwd())
        return importlib.import_module(module_name)
    path = Path(module_name)
    if not path.is_file():
        raise _BadSpec(f"{flag} {spec!r}: no such file {str(path)!r}")
    module_spec = importlib.util.spec_from_file_location(path.stem, path)
    if module_spec is None or module_spec.loader is None:
        raise _BadSpec(f"{flag} {spec!r}: cannot load {str(path)!r} as a module")
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module
