"""The parts of ``kerman.AgentLoop`` (``kerman/loop.py``), one module per responsibility, each a
base class of it."""
