"""The graph-mode pipeline under test, as pure data and functions.

* ``capture_sizes``: the capture-size (bucket) rules and the O(1) padded-size lookup;
* ``modes``: ``CUDAGraphMode`` (configured and runtime graph modes);
* ``dispatcher``: per-batch choice of graph (FULL / PIECEWISE / NONE) and padded size;
* ``metadata``: host-side attention metadata and the FIA padding fix (dummy requests);
* ``stream_budget``: the legacy ACL stream budget that down-samples capture sizes.

Nothing here imports torch or a backend: the runner (``harness.graph.runner``) is the
only place where this logic meets an engine.
"""
