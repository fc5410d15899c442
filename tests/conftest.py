"""Fixtures shared by the harness's own tests."""

from __future__ import annotations

import pytest

from harness.engine import load


@pytest.fixture
def npu():
    """The emulated backend on a fresh device (streams, pools and budget start empty)."""
    backend = load("emulated")
    backend.reset_device()
    yield backend
    backend.reset_device()
