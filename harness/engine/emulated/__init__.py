"""The CPU emulator of the torch.npu graph API (see :mod:`.api` for the namespace)."""

from . import api

__all__ = ["api"]
