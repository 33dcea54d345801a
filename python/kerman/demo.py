"""The showcase's entry point at its first path; the code is :mod:`kerman.cli.demo`."""

from .cli.demo import main

__all__ = ["main"]
