# The fixtures kerman.testing ships for pytest (kerman_loop, kerman_model, kerman_log, kerman_store).
pytest_plugins = ["kerman.testing.pytest_plugin"]
