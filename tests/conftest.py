pytest_plugins = ["conclave.testing.pytest_plugin"]
