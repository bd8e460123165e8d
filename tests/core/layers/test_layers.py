"""mstar.layers against transformers' Llama and Qwen3 code on tiny random configs."""

from __future__ import annotations

import math

import pytest
import torch
from mstar.layers import (
    DecoderLayer,
    RMSNorm,
    RotaryEmbedding,
    head_dim_of,
)
from torch import nn

transformers = pytest.importorskip("transformers")


class DenseCausalAttention:
    """One sequence, no cache: the backend call the layers make, computed densely."""

    def run(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None) -> torch.Tensor:
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        scores = torch.einsum("qhd,khd->hqk", q, k) * (scale or 1 / math.sqrt(q.shape[-1]))
        t = q.shape[0]
        scores = scores.masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), float("-inf"))
        return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)


class Stack(nn.Module):
    """embed → DecoderLayers → norm, named like HF's ``*Model`` (no ``model.`` prefix)."""

    def __init__(self, cfg: dict, qk_norm: bool) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg["vocab_size"], cfg["hidden_size"])
        self.layers = nn.ModuleList(DecoderLayer(cfg, qk_norm) for _ in range(cfg["num_hidden_layers"]))
        self.norm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])
        self.rope = RotaryEmbedding.from_config(cfg, head_dim_of(cfg))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(ids)
        cos, sin = self.rope(torch.arange(ids.numel()), x.dtype)
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, DenseCausalAttention(), i)
        return self.norm(x)


TINY = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, rms_norm_eps=1e-6, max_position_embeddings=256)


def _pair(hf_config, qk_norm: bool) -> tuple[nn.Module, Stack]:
    torch.manual_seed(0)
    hf = transformers.AutoModel.from_config(hf_config).eval()
    with torch.no_grad():  # random norm scales, so a swapped or missing norm shows
        for name, p in hf.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    ours = Stack(hf_config.to_dict(), qk_norm).eval()
    ours.load_state_dict(hf.state_dict(), strict=True)
    return hf, ours


@pytest.mark.parametrize(
    "config_cls, qk_norm, extra",
    [
        ("Qwen3Config", True, dict(head_dim=16, rope_parameters={"rope_type": "default", "rope_theta": 1e6})),
        ("LlamaConfig", False, dict(attention_bias=True, rope_parameters={
            "rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 16})),
        ("LlamaConfig", False, dict(rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0})),
    ],
)
def test_decoder_stack_matches_transformers(config_cls: str, qk_norm: bool, extra: dict) -> None:
    hf_config = getattr(transformers, config_cls)(**TINY, **extra)
    hf, ours = _pair(hf_config, qk_norm)
    ids = torch.randint(0, TINY["vocab_size"], (1, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = hf(input_ids=ids).last_hidden_state[0]
        got = ours(ids[0])
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("head_dim", [8, 32, 128])
def test_rotate_with_the_signed_sine_equals_apply_rope(head_dim: int) -> None:
    from mstar.layers import apply_rope, rotate, signed_sin

    cos, sin = RotaryEmbedding(head_dim, {"rope_theta": 1e6})(torch.arange(0, 3000, 7), torch.float32)
    x = torch.randn(cos.shape[0], 4, head_dim, generator=torch.Generator().manual_seed(head_dim)) * 5
    assert torch.equal(rotate(x, cos, signed_sin(sin)), apply_rope(x, cos, sin))
