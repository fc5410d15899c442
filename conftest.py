"""Root conftest: registers the graph-harness pytest plugin (scenario files under scenarios/)."""

pytest_plugins = ["harness.pytest_plugin"]
