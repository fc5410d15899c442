"""What a *spawned* warm fork server of :mod:`harness.ranks` imports once, before it forks any rank.

Where the server cannot be forked from the harness process (see ``harness.ranks``), it is a fresh
interpreter, and this module is its preload: one intra-op thread set before torch is imported
(no rank inherits a pool sized for the whole machine), :mod:`harness.rank_preload`, then a freeze
of everything built so far (``gc.freeze``), so that a rank's garbage collections never walk the
heap it inherited (hundreds of thousands of torch objects, walked and so copied page by page).
The server itself never runs torch code: forking a process whose thread pools are running can
deadlock the child, so the server only imports.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

import gc  # noqa: E402

import harness.rank_preload  # noqa: E402,F401

torch.set_num_threads(1)  # sets the size only; the pool is created lazily, in each rank
gc.collect()
gc.freeze()
