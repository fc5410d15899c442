"""The fused infer attention op (FIA): a CPU reference of torch_npu's
``npu_fused_infer_attention_score``, its host-side contracts, and call observation.

Modules, read in this order:

* :mod:`harness.ops.contract` -- the host contracts (strict / relaxed / off) and the checks
  that hold under every contract;
* :mod:`harness.ops.observe` -- :class:`FiaCall` records, observers and tags;
* :mod:`harness.ops.signature` -- FIA's keyword arguments, written once (:class:`FiaKeywords`);
* :mod:`harness.ops.reference` -- the deterministic, batch-invariant attention math;
* :mod:`harness.ops.library` -- the ``torch.ops.harness.*`` custom ops and fake kernels;
* :mod:`harness.ops.fia` -- the wrappers (the "host tiling" step) that callers use;
* :mod:`harness.ops.paged_attention` -- torch_npu's ``_npu_paged_attention`` (decode, host
  ``context_lens``) and a device-read variant, registered the same way.

Importing this package registers the ops. It never imports torch_npu: the session installs the
NPU engine's real ops (``capabilities.native_attention``, ``native_paged_attention``) with
:func:`set_native_impl` and :func:`set_native_paged_attention`.
"""

from harness.ops.contract import (
    FIA_CONTRACTS,
    FIA_LAST_ELEMENT_CODE,
    FiaArgumentError,
    FiaContract,
    FiaContractError,
    bounds_violation,
    check_fia_lengths,
    current_fia_contract,
    fia_contract,
    shape_violation,
)
from harness.ops.fia import (
    fia_device_metadata,
    get_max_workspace,
    get_native_impl,
    npu_fused_infer_attention_score,
    npu_fused_infer_attention_score_out,
    observe_device_lengths,
    register_updatable_ops,
    set_native_impl,
)
from harness.ops.library import (DEVICE_METADATA_OP_NAME, FIA_OP_NAME, PAGED_ATTENTION_OP_NAME, UPDATABLE_OP_NAMES,
                                 workspace_nbytes)
from harness.ops.paged_attention import (
    npu_paged_attention,
    npu_paged_attention_device_lens,
    paged_attention_get_workspace,
    set_native_paged_attention,
)
from harness.ops.observe import FiaCall, fia_call_tags, observe_fia_calls

__all__ = [
    "DEVICE_METADATA_OP_NAME",
    "FIA_OP_NAME",
    "PAGED_ATTENTION_OP_NAME",
    "UPDATABLE_OP_NAMES",
    "FIA_CONTRACTS",
    "FIA_LAST_ELEMENT_CODE",
    "FiaArgumentError",
    "FiaCall",
    "FiaContract",
    "FiaContractError",
    "bounds_violation",
    "check_fia_lengths",
    "current_fia_contract",
    "fia_call_tags",
    "fia_contract",
    "fia_device_metadata",
    "get_max_workspace",
    "get_native_impl",
    "npu_fused_infer_attention_score",
    "npu_fused_infer_attention_score_out",
    "npu_paged_attention",
    "npu_paged_attention_device_lens",
    "observe_device_lengths",
    "observe_fia_calls",
    "paged_attention_get_workspace",
    "register_updatable_ops",
    "set_native_impl",
    "set_native_paged_attention",
    "shape_violation",
    "workspace_nbytes",
]
