"""The terminal chat's names at their first path; the code is :mod:`kerman.cli.chat`."""

from .cli._chat_screen import Chat as Chat
from .cli.chat import LOCAL_KEY as LOCAL_KEY
from .cli.chat import PROVIDERS, add_arguments, load_model, run
from .cli.chat import ChatError as ChatError
from .cli.chat import default_store as default_store

__all__ = ["PROVIDERS", "add_arguments", "load_model", "run"]
