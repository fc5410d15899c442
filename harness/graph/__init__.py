"""The graph-mode pipeline under test.

Pure host logic (no torch, no backend):

* ``capture_sizes``: the capture-size (bucket) rules, composed from the features' constraints,
  and the O(1) padded-size lookup;
* ``modes``: ``CUDAGraphMode`` (configured and runtime graph modes);
* ``dispatcher``: per-batch choice of graph (FULL / PIECEWISE / NONE) and padded size;
* ``metadata``: host-side attention metadata and the FIA padding fix (dummy requests);
* ``plan``: the step planner (one frozen ``StepPlan`` per step, dispatched once);
* ``shape``, ``record``, ``scheduler``, ``kv_slots``, ``stream_budget``: rank context, run
  record, batching, the KV slots a request is given, the legacy ACL stream budget.

With torch, meeting an engine only through the object it is handed:

* ``graph_wrapper``: vLLM Ascend's ``ACLGraphWrapper`` (capture per batch descriptor, replay,
  eager passthrough, the debug input-address check) and the forward context it reads;
* ``runner``: captures per key and executes plans through the wrappers; ``drafter``: the MTP
  draft model;
  ``pipeline``: the three paths of every step, in lockstep.
"""
