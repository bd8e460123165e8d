"""mstar.layers.RotaryEmbedding against transformers' rotary embeddings, one test per
``rope_type``, at positions on both sides of the pretraining length.

transformers switches longrope's factors and regrows dynamic NTK's base per forward call
(from the call's longest position); ours decides per token. So each position is compared
with a fresh transformers embedding called on that position alone, which is what a token
decoded one at a time gets there (see ``mstar.layers.rope``)."""

from __future__ import annotations

import pytest
import torch
from mstar.layers import RotaryEmbedding, apply_rope, head_dim_of, rope_parameters

transformers = pytest.importorskip("transformers")
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding  # noqa: E402
from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding, apply_rotary_pos_emb  # noqa: E402

# head_dim 16: eight frequencies, so the ramps/bands of yarn and llama3 fall inside.
TINY = dict(vocab_size=64, hidden_size=64, intermediate_size=48, num_hidden_layers=1, num_attention_heads=4,
            num_key_value_heads=2, rms_norm_eps=1e-6)
L0 = 32  # original_max_position_embeddings
POSITIONS = [0, 1, 7, L0 - 2, L0 - 1, L0, L0 + 1, 2 * L0 + 3, 5 * L0, 401]

SCALINGS = {
    "default": dict(max_position_embeddings=128, rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
    "linear": dict(max_position_embeddings=128, rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}),
    "dynamic": dict(max_position_embeddings=L0, rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}),
    "yarn": dict(max_position_embeddings=4 * L0, rope_parameters={
        "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": L0,
        "beta_fast": 8.0, "beta_slow": 1.0}),
    "yarn-mscale": dict(max_position_embeddings=4 * L0, rope_parameters={
        "rope_type": "yarn", "rope_theta": 500.0, "factor": 8.0, "original_max_position_embeddings": L0,
        "mscale": 1.0, "mscale_all_dim": 0.5, "truncate": False}),
    "yarn-no-factor": dict(max_position_embeddings=4 * L0, rope_parameters={
        "rope_type": "yarn", "rope_theta": 10000.0, "factor": None, "original_max_position_embeddings": L0,
        "attention_factor": 1.3}),
    "llama3": dict(max_position_embeddings=4 * L0, rope_parameters={
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 0.5,
        "high_freq_factor": 4.0, "original_max_position_embeddings": L0}),
    "longrope": dict(max_position_embeddings=4 * L0, original_max_position_embeddings=L0, rope_parameters={
        "rope_type": "longrope", "rope_theta": 10000.0,
        "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.5, 3.1, 3.8], "long_factor": [1.0, 1.5, 2.5, 4.0, 6.0, 9.0, 13.0, 18.0]}),
}


def _hf_cos_sin(rotary: type, config: object, position: int) -> tuple[torch.Tensor, torch.Tensor]:
    emb = rotary(config)  # fresh: its dynamic state starts from the config
    cos, sin = emb(torch.zeros(1, dtype=torch.float32), torch.tensor([[position]]))
    return cos[0, 0], sin[0, 0]


def _ours(config: object) -> RotaryEmbedding:
    cfg = config.to_dict()
    return RotaryEmbedding.from_config(cfg, head_dim_of(cfg))


@pytest.mark.parametrize("name", sorted(SCALINGS))
def test_cos_sin_equal_transformers_at_each_position(name: str) -> None:
    config = transformers.LlamaConfig(**TINY, **SCALINGS[name])
    ours = _ours(config)
    cos, sin = ours.cos_sin(torch.tensor(POSITIONS), torch.float32)  # all positions in one call
    for i, p in enumerate(POSITIONS):
        want_cos, want_sin = _hf_cos_sin(LlamaRotaryEmbedding, config, p)
        torch.testing.assert_close(cos[i], want_cos, atol=1e-5, rtol=0, msg=f"{name} cos at {p}")
        torch.testing.assert_close(sin[i], want_sin, atol=1e-5, rtol=0, msg=f"{name} sin at {p}")


def test_longrope_picks_factors_per_token_where_transformers_picks_per_call() -> None:
    """A call reaching past L0: transformers rotates all of it with the long factors; ours
    keeps the short factors below L0 (what those positions got when they were decoded)."""
    config = transformers.LlamaConfig(**TINY, **SCALINGS["longrope"])
    positions = torch.arange(L0 + 4)
    hf_cos, _ = LlamaRotaryEmbedding(config)(torch.zeros(1), positions[None])
    cos, _ = _ours(config).cos_sin(positions, torch.float32)
    short_cos, _ = LlamaRotaryEmbedding(config)(torch.zeros(1), positions[None, :L0])
    torch.testing.assert_close(cos[:L0], short_cos[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(cos[L0:], hf_cos[0, L0:], atol=1e-5, rtol=0)
    assert not torch.allclose(cos[:L0], hf_cos[0, :L0], atol=1e-3)


def test_partial_rotary_longrope_rotates_like_phi3() -> None:
    """Phi-3 style: half of each head rotated (longrope factors for the rotated dims), the
    rest passed through; q/k rotated equal to transformers' at positions across L0."""
    config = transformers.Phi3Config(**{**TINY, "hidden_size": 128}, partial_rotary_factor=0.5, **SCALINGS["longrope"])
    ours = _ours(config)
    assert ours.rotary_dim == 16
    q = torch.randn(len(POSITIONS), 4, 32, generator=torch.Generator().manual_seed(0))
    cos, sin = ours(torch.tensor(POSITIONS), torch.float32)
    got = apply_rope(q, cos, sin)
    for i, p in enumerate(POSITIONS):
        c, s = _hf_cos_sin(Phi3RotaryEmbedding, config, p)
        want, _ = apply_rotary_pos_emb(q[i : i + 1].transpose(0, 1)[None], q[i : i + 1].transpose(0, 1)[None], c[None, None], s[None, None])
        torch.testing.assert_close(got[i], want[0, :, 0], atol=1e-5, rtol=0, msg=f"position {p}")
    torch.testing.assert_close(got[..., 16:], q[..., 16:], atol=0, rtol=0)


def test_rope_parameters_read_old_and_new_config_forms() -> None:
    assert rope_parameters({"rope_theta": 5.0}) == {"rope_theta": 5.0, "rope_type": "default"}
    old = rope_parameters({"rope_theta": 7.0, "rope_scaling": {"type": "linear", "factor": 2.0}})
    assert old == {"rope_theta": 7.0, "rope_type": "linear", "factor": 2.0}
    phi3 = rope_parameters({"max_position_embeddings": 128, "original_max_position_embeddings": 16, "partial_rotary_factor": 0.5,
                            "rope_scaling": {"type": "longrope", "short_factor": [1.0], "long_factor": [2.0],
                                             "original_max_position_embeddings": 99}})
    assert phi3["original_max_position_embeddings"] == 16 and phi3["partial_rotary_factor"] == 0.5
    yarn = rope_parameters({"max_position_embeddings": 128, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})
    assert yarn["original_max_position_embeddings"] == 128
    with pytest.raises(ValueError, match="unsupported rope_type 'su'"):
        RotaryEmbedding(8, {"rope_type": "su"})
    with pytest.raises(ValueError, match="needs max_position_embeddings"):
        RotaryEmbedding(8, {"rope_type": "dynamic", "factor": 2.0})
