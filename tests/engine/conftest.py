"""Fixtures for the engine tests: a tiny host-list op (the fresh emulated device, `npu`, is tests/conftest.py's)."""

from __future__ import annotations

import torch

from harness.engine.emulated.recorder import register_updatable_op

_lib = torch.library.Library("enginetest", "DEF")
_lib.define("scale_rows(Tensor x, int[] factors) -> Tensor")
_lib.define("scale_rows.out(Tensor x, int[] factors, *, Tensor(a!) out) -> Tensor(a!)")


def _scale(x: torch.Tensor, factors: list[int]) -> torch.Tensor:
    return x * torch.tensor(factors, dtype=x.dtype).unsqueeze(-1)


@torch.library.impl(_lib, "scale_rows", "CPU")
def _scale_rows(x, factors):
    return _scale(x, factors)


@torch.library.impl(_lib, "scale_rows.out", "CPU")
def _scale_rows_out(x, factors, *, out):
    out.copy_(_scale(x, factors))
    return out


@torch.library.register_fake("enginetest::scale_rows")
def _scale_rows_fake(x, factors):
    return torch.empty_like(x)


register_updatable_op("enginetest::scale_rows")

scale_rows = torch.ops.enginetest.scale_rows

