"""What every scenario rank needs, imported once by the process its warm workers are forked from.

A warm rank that finds these in the heap it inherited starts its job at once; one that does not
imports them itself (tenths of a second per worker). Imported by the warm fork server in either
of its forms (:mod:`harness.ranks`): a server forked from the harness process imports this
module in the harness process (harmless there: imports and a cached scan), a spawned one through
:mod:`harness.warm_start`. Neither ``torch._dynamo`` nor sympy: a rank's job reaches neither
(tests/ranks checks it).
"""

from __future__ import annotations

import torch.distributed  # noqa: F401 - every multi-rank job creates a process group

import harness.engine.emulated  # noqa: F401 - the default backend: every rank loads it
import harness.executor  # noqa: F401 - the scenario rank job's module
from harness.features import registry

registry()  # the scan of installed feature plugins (tens of ms), cached per sys.path
