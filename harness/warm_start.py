"""What the warm fork server of :mod:`harness.ranks` imports once, before it forks any rank.

A rank forked from a server that already holds torch starts in milliseconds instead of paying
interpreter start and ``import torch`` (seconds) per rank per item. The server itself never
runs torch code: forking a process whose thread pools are running can deadlock the child, so
the server only imports. It imports the emulated engine, which every rank of the default
backend loads (tenths of a second per rank otherwise), and not ``torch._dynamo`` or sympy: a
rank's job reaches neither (tests/ranks checks it), and each would make the server's start and
every rank's inherited heap bigger. One intra-op thread is set before torch is imported so that
no rank inherits a pool sized for the whole machine.

It also does, once, what every rank would otherwise repeat: the scan of installed feature
plugins (an entry-point scan of site-packages, tens of milliseconds), and it freezes what it
has built (``gc.freeze``), so that a rank's garbage collections never walk the heap it
inherited (hundreds of thousands of torch objects, walked and so copied page by page).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
import torch.distributed  # noqa: E402,F401

import gc  # noqa: E402

import harness.engine.emulated  # noqa: E402,F401 - the default backend: every rank loads it
import harness.session  # noqa: E402,F401 - the scenario rank job's module
from harness.features import registry  # noqa: E402

torch.set_num_threads(1)  # sets the size only; the pool is created lazily, in each rank
registry()  # cached per sys.path, which a forked rank shares
gc.collect()
gc.freeze()
