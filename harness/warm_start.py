"""What the warm fork server of :mod:`harness.ranks` imports once, before it forks any rank.

A rank forked from a server that already holds torch starts in milliseconds instead of paying
interpreter start and ``import torch`` (seconds) per rank per item. The server itself never
runs torch code: forking a process whose thread pools are running can deadlock the child, so
the server only imports. ``torch._dynamo`` is here because torch's ``disable`` wrapper around
graph capture imports it lazily: once per server instead of once per rank per item (drop the
line if the hot path stops reaching it). One intra-op thread is set before torch is imported so that no rank
inherits a pool sized for the whole machine.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
import torch._dynamo  # noqa: E402,F401 - torch imports it lazily on the first graph capture (~2 s)
import torch.distributed  # noqa: E402,F401

torch.set_num_threads(1)  # sets the size only; the pool is created lazily, in each rank
