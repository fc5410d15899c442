"""graph-harness: graph-mode (ACL graph / CUDA graph) scenarios as data.

Layers, top to bottom (imports only run downward):

* ``harness.pytest_plugin`` / ``harness.report``: pytest glue and reports;
* ``harness.scenario``: YAML scenarios, schema, matrix expansion;
* ``harness.checks``: the four assertions;
* ``harness.features``: SP / DP / MTP / CP as composable axes;
* ``harness.graph``: the graph-mode pipeline under test (buckets, modes, dispatch,
  attention metadata and padding fixes, runner);
* ``harness.model``: small decoder LMs with a paged KV cache;
* ``harness.ops``: the fused infer attention (FIA) op;
* ``harness.engine``: capture/replay backends behind one torch.npu-shaped API.
"""

__version__ = "0.1.0"
