"""The talker's cheaper CPU forms compute the same bits as the reference formulas: its
layers (core's fused ``rms_norm``) against the Llama formula, ``rotate`` against
``apply_rope``, and the code predictor's per-frame RoPE tables against a call per step."""

from __future__ import annotations

import pytest
import torch
from mstar.layers import RotaryEmbedding, apply_rope, rotate, signed_sin
from mstar.layers.norm import rms_norm_formula
from mstar_qwen3tts.code_predictor import CodePredictor
from mstar_qwen3tts.transformer import QKNormAttention
from qwen3tts_helpers import small_predictor


@pytest.mark.parametrize("head_dim", [8, 32, 128])
def test_rotate_with_the_signed_sine_equals_apply_rope(head_dim) -> None:
    gen = torch.Generator().manual_seed(head_dim)
    cos, sin = RotaryEmbedding(head_dim, {"rope_theta": 1_000_000.0}).cos_sin(torch.arange(0, 3000, 7), torch.float32)
    x = torch.randn(cos.shape[0], 4, head_dim, generator=gen) * 5
    cos, sin = cos[:, None, :], sin[:, None, :]
    assert torch.equal(rotate(x, cos, signed_sin(sin)), apply_rope(x, cos, sin))


def _formula(norm, x: torch.Tensor) -> torch.Tensor:
    return rms_norm_formula(x, norm.weight, norm.eps)


def _reference_qkv(attn: QKNormAttention, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """The layer's q/k/v by the reference formulas (the code before the cheaper forms)."""
    lead = x.shape[:-1]
    q = _formula(attn.q_norm, attn.q_proj(x).view(*lead, attn.num_heads, attn.head_dim))
    k = _formula(attn.k_norm, attn.k_proj(x).view(*lead, attn.num_kv_heads, attn.head_dim))
    v = attn.v_proj(x).view(*lead, attn.num_kv_heads, attn.head_dim)
    return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v


def _predictor() -> CodePredictor:
    return small_predictor(talker_hidden=80)


def test_attention_qkv_equals_the_reference_formulas() -> None:
    attn = _predictor().model.layers[0].self_attn
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(8, 3, 64, generator=gen)
    cos, sin = RotaryEmbedding(16, {"rope_theta": 1_000_000.0}).cos_sin(torch.arange(3), torch.float32)
    cos, sin = cos[:, None, :], sin[:, None, :]
    got = attn.qkv(x, cos, signed_sin(sin))
    for a, b in zip(got, _reference_qkv(attn, x, cos, sin), strict=True):
        assert torch.equal(a, b)


class _Argmax:
    def sample_aux(self, label: str, logits: torch.Tensor):
        from types import SimpleNamespace

        return SimpleNamespace(tokens=logits.argmax(-1))


def test_predictor_rope_tables_equal_a_call_per_step() -> None:
    model = _predictor()
    calls: list[tuple[int, torch.Tensor, torch.Tensor]] = []
    for i, layer in enumerate(model.model.layers):
        orig = layer.forward_dense

        def spy(x, cos, sin, cache, orig=orig, i=i):
            if i == 0:
                calls.append((x.shape[1], cos, sin))
            return orig(x, cos, sin, cache)

        layer.forward_dense = spy  # type: ignore[method-assign]
    gen = torch.Generator().manual_seed(2)
    with torch.inference_mode():
        model(torch.randn(5, 80, generator=gen), torch.randn(5, 80, generator=gen), _Argmax())
    start = 0
    assert [n for n, _, _ in calls] == [2, 1, 1, 1, 1]
    for n, cos, sin in calls:
        want_cos, want_sin = RotaryEmbedding(16, {"rope_theta": 1_000_000.0}).cos_sin(torch.arange(start, start + n), torch.float32)
        assert torch.equal(cos, want_cos[:, None, :]) and torch.equal(sin, signed_sin(want_sin)[:, None, :])
        start += n
