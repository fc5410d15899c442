"""pytest plugin of graph-harness (collection of YAML scenarios lands with the scenario harness)."""
