"""The showcase's names at their first path; the code is :mod:`kerman.cli.demo`."""

from .cli.demo import DESTRUCTIVE as DESTRUCTIVE
from .cli.demo import HIDDEN as HIDDEN
from .cli.demo import SESSION as SESSION
from .cli.demo import DemoModel as DemoModel
from .cli.demo import main

__all__ = ["main"]
