"""The keyword arguments of ``npu_fused_infer_attention_score``, written once.

torch_npu's FIA takes ``query, key, value`` and a dozen keyword arguments. They are defined
here and nowhere else, as the fields of :class:`FiaKeywords` (torch_npu's names, types and
defaults; its lists are ``SymInt[]?``): the ``torch.library`` schemas of the functional and
``.out`` ops (:mod:`harness.ops.library`) are rendered from the fields, the kernels and fake
kernels read the keywords as one :class:`FiaKeywords`, and the wrappers
(:mod:`harness.ops.fia`) take them by name, check the names against it and show them in their
signature. A keyword added or changed here reaches every one of them.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from torch import Tensor

from harness.plain import Kwargs

__all__ = ["FIA_KEYWORD_NAMES", "FiaKeywords", "wrapper_signature"]


def _schema(kind: str) -> dict[str, str]:
    """A field's type in a ``torch.library`` schema (``SymInt[]?``, ``Tensor?``, ``int``...)."""
    return {"schema": kind}


@dataclass(frozen=True)
class FiaKeywords:
    """FIA's keyword arguments, with torch_npu's defaults."""

    actual_seq_lengths: Sequence[int] | None = field(default=None, metadata=_schema("SymInt[]?"))
    actual_seq_lengths_kv: Sequence[int] | None = field(default=None, metadata=_schema("SymInt[]?"))
    block_table: Tensor | None = field(default=None, metadata=_schema("Tensor?"))
    block_size: int = field(default=0, metadata=_schema("int"))
    num_heads: int = field(default=1, metadata=_schema("int"))
    num_key_value_heads: int = field(default=0, metadata=_schema("int"))
    scale: float = field(default=1.0, metadata=_schema("float"))
    input_layout: str = field(default="TND", metadata=_schema("str"))
    sparse_mode: int = field(default=0, metadata=_schema("int"))
    atten_mask: Tensor | None = field(default=None, metadata=_schema("Tensor?"))
    softmax_lse_flag: bool = field(default=False, metadata=_schema("bool"))

    @classmethod
    def of(cls, caller: str, keywords: Mapping[str, Any]) -> FiaKeywords:
        """The keywords a wrapper was called with; an unknown name is the ``TypeError`` Python
        raises for a function that lacks it (the wrapper's, not this class's)."""
        unknown = keywords.keys() - FIA_KEYWORD_NAMES
        if unknown:
            raise TypeError(f"{caller}() got an unexpected keyword argument {min(unknown)!r}")
        return cls(**keywords)

    @classmethod
    def schema(cls) -> str:
        """The keywords as a ``torch.library`` schema declares them: ``SymInt[]?
        actual_seq_lengths=None, ..., bool softmax_lse_flag=False``."""
        return ", ".join(f"{f.metadata['schema']} {f.name}={_schema_default(f.default)}" for f in fields(cls))

    @property
    def kv_heads(self) -> int:
        """KV heads: ``num_key_value_heads``, where 0 means as many as ``num_heads``."""
        return self.num_key_value_heads or self.num_heads

    def as_kwargs(self, **changed: object) -> Kwargs:
        """The keywords as a call passes them (``changed`` replacing some), tensors not copied."""
        out = {name: getattr(self, name) for name in FIA_KEYWORD_NAMES}
        out.update(changed)
        return out


FIA_KEYWORD_NAMES: tuple[str, ...] = tuple(f.name for f in fields(FiaKeywords))


def _schema_default(value: object) -> str:
    if isinstance(value, str):
        return json.dumps(value)  # "TND"
    return repr(value)  # None, False, 0, 1.0


def wrapper_signature(*extra: inspect.Parameter) -> inspect.Signature:
    """A wrapper's signature as ``inspect`` and ``help()`` show it: ``query, key, value``, every
    FIA keyword, then the wrapper's own keyword-only ``extra`` parameters."""
    positional = [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=Tensor)
                  for name in ("query", "key", "value")]
    keywords = [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=f.type)
                for f in fields(FiaKeywords)]
    return inspect.Signature([*positional, *keywords, *extra])
