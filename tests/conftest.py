"""Fixtures shared by the harness's own tests."""

from __future__ import annotations

import pytest
import torch

# Once per process, before any pytester run: its in-process runs restore sys.modules after each
# run, and a module that defines torch.library ops (the emulator's collectives) cannot be
# imported a second time.
import harness.engine.emulated  # noqa: F401
from harness.engine import load


@pytest.fixture
def npu():
    """The emulated backend on a fresh device (streams, pools and budget start empty)."""
    backend = load("emulated")
    backend.reset_device()
    yield backend
    backend.reset_device()


@pytest.fixture
def on_npu(npu):
    """The emulated backend, with torch's factory functions making tensors on its device (what
    code under test does with ``device=engine.device``); pass ``device="cpu"`` for a host tensor."""
    with torch.device(npu.device):
        yield npu
