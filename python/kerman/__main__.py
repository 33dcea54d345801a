"""``python -m kerman``: the command line."""

from .cli import main

raise SystemExit(main())
