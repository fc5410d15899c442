"""Ranks on devices: which process-group backend, how a rank is started, which device it owns.

* **Never forked from a process that has initialised the device.** CUDA (and the NPU runtime)
  cannot be used in a child forked after the parent initialised it ("Cannot re-initialize CUDA
  in forked subprocess": every multi-rank item of the 2026-12-04 H200 run died of it), and the
  harness process initialises it as soon as it names the device. So ranks of a device backend are
  spawned (a fresh interpreter each, :data:`START_METHODS`); the warm fork server stays for the
  emulator, whose ranks never touch a device.
* **One device per rank.** Each rank is told its ``LOCAL_RANK`` (one host: its rank) and takes
  device ``LOCAL_RANK`` (:func:`device_index`) before it creates its process group or anything
  else (:func:`rank_device`). Two NCCL ranks on one GPU fail at ``init_process_group``
  ("Duplicate GPU detected : rank 0 and rank 1 both on CUDA device", NCCL 2.28.9 on the H200),
  so an item with more ranks than devices is skipped (:func:`too_few_devices`).
* **Device collectives on the device's library, host ones on gloo.** The process group of a
  device backend is ``cpu:gloo,cuda:nccl`` (``cpu:gloo,npu:hccl``): tensors on the device go
  through NCCL / HCCL, which a graph can capture, while the host-side exchanges of the
  features (DP's agreement on each step's shape, int64 tensors on the host) go through gloo, as
  vLLM keeps a CPU group beside the device one
  (``vllm/distributed/parallel_state.py``, ``GroupCoordinator.cpu_group``). The emulator's ranks
  use gloo (and their shared-memory collectives, :mod:`harness.engine.emulated.collectives`).

What each backend is comes from its declared capabilities (``physical_device``,
``device_type``, ``distributed_backend`` in :data:`harness.engine.protocol.CAPABILITIES`): an
emulated device lives in the host process, so its ranks need no device and may be forked.
Pure functions of names and counts, unit-tested on a CPU; only :func:`device_count` and
:func:`rank_device` touch torch (imported inside them: ``harness.ranks`` imports no torch).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Literal

from harness.engine.protocol import CAPABILITIES

if TYPE_CHECKING:
    import torch

__all__ = ["LOCAL_RANK_ENV", "START_METHODS", "StartMethod", "device_count", "device_index", "group_device_type",
           "group_start_method", "local_rank", "process_group_backend", "rank_device", "rank_device_type",
           "rank_env", "start_method", "too_few_devices"]

StartMethod = Literal["forkserver", "spawn"]

LOCAL_RANK_ENV = "LOCAL_RANK"
"""The rank's index among the ranks of its host, as torchrun names it."""


_LIBRARIES = {"nccl": "cuda", "hccl": "npu"}  # collective library -> the device type it serves

START_METHODS: dict[str, StartMethod] = {"cpu": "forkserver", "cuda": "spawn", "npu": "spawn"}
"""How a rank on each device type is started: the warm fork server (:mod:`harness.ranks.pool`)
on the host, a fresh interpreter where the parent may have initialised the device."""


def rank_device_type(engine: str) -> str:
    """The device type a rank of engine backend ``engine`` must own: ``cpu`` (none) for an
    emulated device, which lives in the rank's own host memory."""
    caps = _capabilities(engine)
    return caps.device_type if caps.physical_device else "cpu"


def process_group_backend(engine: str) -> str:
    """The process-group backend for ranks of engine backend ``engine`` (``emulated``, ``cuda``,
    ``npu``): ``gloo`` for an emulated device, else the device's library beside gloo for host
    tensors (``cpu:gloo,cuda:nccl``)."""
    caps = _capabilities(engine)
    if not caps.physical_device:
        return caps.distributed_backend
    return f"cpu:gloo,{caps.device_type}:{caps.distributed_backend}"


def _capabilities(engine: str):  # noqa: ANN202 - harness.engine.protocol.Capabilities
    try:
        return CAPABILITIES[engine]
    except KeyError:
        raise ValueError(f"unknown engine backend {engine!r}; one of {', '.join(CAPABILITIES)}") from None


def group_device_type(group_backend: str) -> str | None:
    """The device type whose library a process-group backend uses (``nccl`` and
    ``cpu:gloo,cuda:nccl``: ``cuda``), None for a host-only one (``gloo``)."""
    if ":" not in group_backend:
        return _LIBRARIES.get(group_backend)
    for part in group_backend.split(","):
        device, _, _ = part.partition(":")
        if device.strip() != "cpu":
            return device.strip()
    return None


def start_method(engine: str) -> StartMethod:
    """How ranks of engine backend ``engine`` are started: ``spawn`` for a device backend (the
    harness process has initialised the device: never fork it), ``forkserver`` (warm, reused
    workers) for the emulator."""
    return START_METHODS[rank_device_type(engine)] if engine in CAPABILITIES else "forkserver"


def group_start_method(group_backend: str) -> StartMethod:
    """:func:`start_method` for a run given its process-group backend (what :func:`run_ranks` gets)."""
    device = group_device_type(group_backend)
    return START_METHODS.get(device, "spawn") if device else "forkserver"


def rank_env(rank: int) -> dict[str, str]:
    """What a rank's environment says about its place on the host (one host: local rank = rank)."""
    return {LOCAL_RANK_ENV: str(rank)}


def local_rank() -> int:
    """This rank's ``LOCAL_RANK`` (0 in a process that is no rank of a run: a single-rank item)."""
    return int(os.environ.get(LOCAL_RANK_ENV, "0"))


def device_index(local_rank: int, device_count: int) -> int:
    """The device a rank owns: the one numbered as its local rank (never shared: two NCCL ranks
    on one GPU fail). Raises when the host has no such device."""
    if local_rank < 0:
        raise ValueError(f"local rank {local_rank} is negative")
    if local_rank >= device_count:
        raise ValueError(f"local rank {local_rank} needs device {local_rank}, but {device_count} "
                         f"device(s) are visible")
    return local_rank


def too_few_devices(engine: str, world_size: int, device_count: int) -> str | None:
    """Why an item of ``world_size`` ranks cannot run on ``device_count`` devices of backend
    ``engine`` (one device per rank), else None. The emulator needs none."""
    if rank_device_type(engine) == "cpu" or world_size <= device_count:
        return None
    return f"needs {world_size} devices, found {device_count}"


def device_count(engine: str) -> int:
    """Devices of backend ``engine`` visible here (0 for the emulator, which needs none).
    ``torch.cuda.device_count`` asks the driver without initialising CUDA in this process."""
    device = rank_device_type(engine)
    if device == "cpu":
        return 0
    import torch

    if device == "npu":
        import torch_npu  # noqa: F401 - registers torch.npu (only reached on the npu backend)
    return int(getattr(torch, device).device_count())


def rank_device(engine_or_device: str) -> "torch.device":
    """This rank's device, made the current one: call it first in a rank's job, before anything
    is built (``torch.cuda.set_device(LOCAL_RANK)``, ``torch.npu`` alike). The host for the
    emulator (``emulated`` or ``cpu``). Accepts an engine backend name or a device type."""
    import torch

    device = rank_device_type(engine_or_device) if engine_or_device in CAPABILITIES else engine_or_device
    if device == "cpu":
        return torch.device("cpu")
    if device not in ("cuda", "npu"):
        raise ValueError(f"no rank device for {engine_or_device!r}; one of {', '.join(CAPABILITIES)}, cpu")
    index = device_index(local_rank(), device_count(device))  # imports torch_npu for npu
    getattr(torch, device).set_device(index)
    return torch.device(device, index)
