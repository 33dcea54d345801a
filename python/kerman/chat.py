"""The terminal chat's public names at their first path; the code is :mod:`kerman.cli.chat`."""

from .cli.chat import PROVIDERS, add_arguments, load_model, run

__all__ = ["PROVIDERS", "add_arguments", "load_model", "run"]
