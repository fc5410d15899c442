import pytest
import torch

from harness.model import ModelConfig, resolve_dtype


def test_defaults_are_valid():
    for cfg in (ModelConfig(), ModelConfig.canary(), ModelConfig.random(dtype="bf16")):
        assert cfg.torch_dtype in (torch.float32, torch.bfloat16)
    assert ModelConfig.canary().kind == "canary"
    assert ModelConfig(dtype=torch.bfloat16).torch_dtype is torch.bfloat16
    assert ModelConfig(dtype="bfloat16").torch_dtype is torch.bfloat16
    assert resolve_dtype("torch.float32") is torch.float32


def test_frozen():
    cfg = ModelConfig()
    with pytest.raises(Exception):
        cfg.num_layers = 3  # type: ignore[misc]
    assert cfg.replace(num_layers=3).num_layers == 3


@pytest.mark.parametrize(
    "changes, match",
    [
        ({"kind": "llama"}, "kind"),
        ({"num_layers": 0}, "num_layers"),
        ({"hidden_size": -1}, "hidden_size"),
        ({"num_heads": 3, "num_kv_heads": 2}, "multiple of num_kv_heads"),
        ({"dtype": "float16"}, "dtype"),
        ({"dtype": torch.float16}, "dtype"),
        ({"num_blocks": 1}, "null block"),
        ({"seed": -1}, "seed"),
        ({"block_size": True}, "block_size"),
        ({"rms_norm_eps": 0.0}, "rms_norm_eps"),
        ({"intermediate_size": 0}, "intermediate_size"),
    ],
)
def test_validation_errors(changes, match):
    with pytest.raises(ValueError, match=match):
        ModelConfig(**changes)


@pytest.mark.parametrize(
    "changes, match",
    [
        ({"vocab_size": 100, "max_model_len": 200}, "vocab_size"),
        ({"head_dim": 4}, "head_dim"),
        ({"hidden_size": 24}, "hidden_size"),
    ],
)
def test_canary_validation(changes, match):
    with pytest.raises(ValueError, match=match):
        ModelConfig.canary(**changes)
    ModelConfig.random(**changes)  # the same shapes are fine for the random kind


def test_derived():
    cfg = ModelConfig(max_model_len=100, block_size=16, vocab_size=300)
    assert cfg.max_blocks_per_seq == 7
    assert cfg.canary_bits == 9
    assert cfg.mlp_size == 2 * cfg.hidden_size
