"""pytest fixtures for testing Kerman plugins. Load it explicitly, in a ``conftest.py``::

    pytest_plugins = ["kerman.testing.pytest_plugin"]

(or ``pytest -p kerman.testing.pytest_plugin``). It is not an auto-loaded ``pytest11`` entry
point: that would import Kerman's native extension into every pytest run of every project
whose environment has Kerman installed, whether it tests a plugin or not.

Fixtures (all prefixed ``kerman_``, function-scoped):

* ``kerman_store`` — a fresh ``kerman.MemoryStore``;
* ``kerman_log`` — a ``SessionLog`` in it (closed after the test);
* ``kerman_model`` — an empty ``kerman.models.ScriptedModel`` (``.add(...)`` replies; its
  ``.requests`` records what the model was asked);
* ``kerman_loop`` — an ``AgentLoop(kerman_model, log=kerman_log)``; install your plugin on it
  and drive it with ``kerman.testing.run_turn``. Its inbox is closed after the test.
"""

from __future__ import annotations

from typing import Iterator

import pytest

from .. import AgentLoop, MemoryStore, SessionLog
from ..models import ScriptedModel

__all__ = ["kerman_store", "kerman_log", "kerman_model", "kerman_loop"]


@pytest.fixture
def kerman_store() -> MemoryStore:
    return MemoryStore()


@pytest.fixture
def kerman_log(kerman_store: MemoryStore) -> Iterator[SessionLog]:
    log = kerman_store.create()
    yield log
    log.close()


@pytest.fixture
def kerman_model() -> ScriptedModel:
    return ScriptedModel()


@pytest.fixture
def kerman_loop(kerman_model: ScriptedModel, kerman_log: SessionLog) -> Iterator[AgentLoop]:
    loop = AgentLoop(kerman_model, log=kerman_log)
    yield loop
    # The test's event loop is gone by now (asyncio.run returned): give the log back without one.
    loop.inbox.close()
