"""What vLLM Ascend's graph wrapper tells a user whose capture ran out of device streams.

Since PR #9962 (5f2ef5a0b2, first tag v0.21.0rc1), when the capture budget was removed,
``ACLGraphWrapper`` catches a ``RuntimeError`` raised inside ``torch.npu.graph(...)`` and, when its
text has a stream-resource signature, raises a new ``RuntimeError`` whose text is a line of
advice, then ``"\\nOriginal error:\\n"`` and the runtime's own text
(``vllm_ascend/compilation/acl_graph.py``). That first line is what a user searches for, so a
report shows it. Releases before PR #9962 let the runtime's error through as it was.

The signature, as upstream tests it: the lower-cased text contains ``insufficient_stream_resources``
or ``stream resources are insufficient``, or it contains ``207008`` and ``stream resource``.
On main (PR #10555, a2e91398a9, first tag v0.24.0rc1) the advice is reworded and an old HDK's
``Alloc sq cq fail`` gets advice of its own, checked first.
"""

from __future__ import annotations

from typing import Literal

__all__ = ["GUIDANCE", "OLD_HDK_GUIDANCE", "CaptureErrorGuidance", "capture_error_text",
           "is_old_hdk_capture_error", "is_stream_resource_capture_error"]

CaptureErrorGuidance = Literal["pr9962", "pr10555"]

#: The advice line per upstream version (v0.23.0's ``_STREAM_RESOURCE_GUIDANCE``; main's inline text).
GUIDANCE: dict[str, str] = {
    "pr9962": (
        "ACL graph capture failed with a known stream-resource exhaustion "
        "signature. Consider upgrading to a newer HDK/CANN stack, reducing "
        "cudagraph_capture_sizes, lowering max_cudagraph_capture_size, preferring "
        "FULL or FULL_DECODE_ONLY for mostly uniform decode workloads, or "
        "temporarily disabling graph mode to confirm the failure is capture-related."
    ),
    "pr10555": (
        "ACL graph capture failed with a known stream-resource exhaustion "
        "signature. Consider reducing cudagraph_capture_sizes, lowering "
        "max_cudagraph_capture_size, preferring FULL or FULL_DECODE_ONLY for "
        "mostly uniform decode workloads, or temporarily disabling graph mode "
        "to confirm the failure is capture-related."
    ),
}
#: main's advice for an old HDK/CANN stack (PR #10555), checked before the stream signature.
OLD_HDK_GUIDANCE = (
    "ACL graph capture failed with an old Ascend HDK/CANN stack "
    "signature (`Alloc sq cq fail`). Please upgrade Ascend HDK to "
    "25.5.1 or later and use the matching CANN stack."
)

_STREAM_RESOURCE_ERROR_CODE = "207008"
_STREAM_RESOURCE_ERROR_MARKERS = ("insufficient_stream_resources", "stream resources are insufficient")
_OLD_HDK_CAPTURE_ERROR_MARKERS = ("alloc sq cq fail",)


def is_stream_resource_capture_error(message: str) -> bool:
    lowered = message.lower()
    if any(marker in lowered for marker in _STREAM_RESOURCE_ERROR_MARKERS):
        return True
    return _STREAM_RESOURCE_ERROR_CODE in message and "stream resource" in lowered


def is_old_hdk_capture_error(message: str) -> bool:
    return any(marker in message.lower() for marker in _OLD_HDK_CAPTURE_ERROR_MARKERS)


def capture_error_text(original: str, guidance: CaptureErrorGuidance | None) -> str | None:
    """The text of the error the wrapper raises instead of ``original``; None: it re-raises as is.

    ``guidance`` is the stack's (``StackProfile.capture_error_guidance``); ``original`` the
    runtime's text (with its cause's, where the backend wrapped the runtime's own error)."""
    if guidance is None:
        return None
    if guidance not in GUIDANCE:
        raise ValueError(f"capture_error_guidance must be one of {sorted(GUIDANCE)} or None, got {guidance!r}")
    if guidance == "pr10555" and is_old_hdk_capture_error(original):
        return f"{OLD_HDK_GUIDANCE}\nOriginal error:\n{original}"
    if is_stream_resource_capture_error(original):
        return f"{GUIDANCE[guidance]}\nOriginal error:\n{original}"
    return None
