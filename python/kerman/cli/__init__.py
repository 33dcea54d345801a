"""The ``kerman`` command line (also ``python -m kerman``).

``kerman log list|show|tail|inbox|verify|repair`` inspect session files without modifying them
(no lock, so a session an agent is running can be read; no torn-tail repair, no crash closers)
except ``repair``, which only acts on explicit confirmation. ``tail --follow`` follows a live
session until interrupted. ``list``, ``show``, ``tail`` and ``inbox`` also read a PostgreSQL
store, named by its DSN (``postgresql://…``), as a read-only follower (no lease). ``kerman demo`` runs the
showcase. Errors are one line on stderr, never a traceback: exit 2 for usage and a missing store,
1 for everything else that went wrong.
"""

from ._common import LARGE_FILE_BYTES as LARGE_FILE_BYTES
from ._common import STORE_HELP as STORE_HELP
from ._common import human_size
from ._main import main

__all__ = ["main", "human_size"]
