"""Whole tiny random transformers models (Llama, Phi-3, Qwen2, Qwen3, Mistral) reproduced by
``mstar.text.lm.DecoderLM`` built from the same config and state dict: every projection
layout (split and fused q/k/v and gate/up, either checkpoint into either module through
``mstar.weights.Packed``), biases, partial rotary, QK-norm, tied embeddings and sliding
windows, logits equal in float32."""

from __future__ import annotations

import math

import pytest
import torch
from mstar.layers import full_attention_limit, sliding_window_of
from mstar.text.lm import DecoderLM
from mstar.weights import Packed, StateDictSource, load_weights

transformers = pytest.importorskip("transformers")

TINY = dict(vocab_size=96, hidden_size=64, intermediate_size=80, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, rms_norm_eps=1e-6, max_position_embeddings=64, pad_token_id=0, bos_token_id=1,
            eos_token_id=2)
QKV = Packed("qkv_proj", ("q_proj", "k_proj", "v_proj"))
GATE_UP = Packed("gate_up_proj", ("gate_proj", "up_proj"))
LENGTH = 14


class DenseCausalAttention:
    """One sequence, no cache: the backend call the layers make, computed densely."""

    def run(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None,
            window: int | None = None) -> torch.Tensor:
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        scores = torch.einsum("qhd,khd->hqk", q, k) * (scale or 1 / math.sqrt(q.shape[-1]))
        t = q.shape[0]
        allowed = torch.ones(t, t, dtype=torch.bool).tril()
        if window is not None:
            allowed &= ~torch.ones(t, t, dtype=torch.bool).tril(-window)
        scores = scores.masked_fill(~allowed, float("-inf"))
        return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)


def _hf(cls_name: str, **config: object) -> torch.nn.Module:
    torch.manual_seed(0)
    hf_config = getattr(transformers, cls_name.replace("ForCausalLM", "Config"))(**{**TINY, **config})
    model = getattr(transformers, cls_name)(hf_config).eval()
    with torch.no_grad():  # random norm scales and biases, so a swapped or missing one shows
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
            elif name.endswith(".bias"):
                p.normal_(0, 0.5)
    return model


def _ours(hf: torch.nn.Module, state: dict | None = None, packed: tuple = (), **options: object) -> DecoderLM:
    lm = DecoderLM(hf.config.to_dict(), **options).eval()
    load_weights(lm, StateDictSource(state if state is not None else hf.state_dict(), "hf"), packed=packed)
    return lm


def _logits(lm: DecoderLM, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return lm.logits(lm.hidden_states(ids, torch.arange(ids.numel()), DenseCausalAttention()))


def _assert_same_logits(hf: torch.nn.Module, lm: DecoderLM, length: int = LENGTH) -> None:
    ids = torch.randint(3, TINY["vocab_size"], (length,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = hf(input_ids=ids[None]).logits[0]
    torch.testing.assert_close(_logits(lm, ids), want, atol=1e-5, rtol=1e-5)


def test_llama_with_biases_and_tied_embeddings() -> None:
    hf = _hf("LlamaForCausalLM", attention_bias=True, mlp_bias=True, tie_word_embeddings=True,
             rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 0.5,
                              "high_freq_factor": 4.0, "original_max_position_embeddings": 16})
    lm = _ours(hf)
    assert lm.lm_head.weight is lm.model.embed_tokens.weight
    _assert_same_logits(hf, lm)
    # A tied checkpoint saved with one name of the pair loads as well.
    state = {k: v for k, v in hf.state_dict().items() if k != "lm_head.weight"}
    _assert_same_logits(hf, _ours(hf, state))


def test_llama_split_checkpoint_into_fused_projections() -> None:
    hf = _hf("LlamaForCausalLM", rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0})
    lm = _ours(hf, packed=(QKV, GATE_UP), fused_qkv=True, fused_gate_up=True)
    assert {"qkv_proj", "o_proj"} <= set(lm.model.layers[0].self_attn._modules)
    _assert_same_logits(hf, lm)


def test_phi3_fused_checkpoint_partial_rotary_longrope() -> None:
    rope = {"rope_type": "longrope", "rope_theta": 10000.0,
            "short_factor": [1.0, 1.2, 1.5, 2.0], "long_factor": [1.0, 2.0, 4.0, 8.0]}
    hf = _hf("Phi3ForCausalLM", partial_rotary_factor=0.5, original_max_position_embeddings=16, rope_parameters=rope)
    assert hf.config.rope_parameters["partial_rotary_factor"] == 0.5
    lm = _ours(hf, fused_qkv=True, fused_gate_up=True)
    assert lm.model.rope.rotary_dim == 8
    _assert_same_logits(hf, lm)
    # Phi-3's fused checkpoint into split modules.
    _assert_same_logits(hf, _ours(hf, packed=(QKV, GATE_UP)))


def test_qwen2_qkv_biases_without_o_bias() -> None:
    hf = _hf("Qwen2ForCausalLM", rope_parameters={"rope_type": "default", "rope_theta": 1e6})
    lm = _ours(hf, qkv_bias=True, o_bias=False)
    assert lm.model.layers[0].self_attn.q_proj.bias is not None and lm.model.layers[0].self_attn.o_proj.bias is None
    _assert_same_logits(hf, lm)


def test_qwen3_qk_norm() -> None:
    hf = _hf("Qwen3ForCausalLM", head_dim=24, rope_parameters={"rope_type": "default", "rope_theta": 1e6})
    _assert_same_logits(hf, _ours(hf, qk_norm=True))


@pytest.mark.parametrize("family", ["mistral", "qwen2"])
def test_sliding_windows_past_the_window_on_the_paged_cache(family: str) -> None:
    """20 positions through the real torch backend with a window of 6: a 9-token prefill
    (queries past the window) and decode steps (the decode buffer's path); Qwen2 with
    max_window_layers 1 (layer 0 full, layer 1 windowed). Logits equal transformers' at
    every position, and the node serves its whole max_position_embeddings."""
    rope = {"rope_type": "default", "rope_theta": 1e6}
    if family == "mistral":
        hf = _hf("MistralForCausalLM", sliding_window=6, rope_parameters=rope)
        lm = _ours(hf)
    else:
        hf = _hf("Qwen2ForCausalLM", use_sliding_window=True, sliding_window=6, max_window_layers=1, rope_parameters=rope)
        lm = _ours(hf, qkv_bias=True, o_bias=False)
        assert [layer.self_attn.window for layer in lm.model.layers] == [None, 6]
    assert lm.max_model_len() == TINY["max_position_embeddings"]
    ids = torch.randint(3, TINY["vocab_size"], (20,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = hf(input_ids=ids[None]).logits[0]
    torch.testing.assert_close(_paged_logits(lm, ids, first=9), want, atol=1e-5, rtol=1e-5)
    _assert_same_logits(hf, lm, length=20)  # the dense reference applies the same windows
    # Layers built without their index attend whole rows: the node is capped at the window.
    for layer in lm.model.layers:
        layer.self_attn.window = None
    assert lm.max_model_len() == 6


def test_sliding_window_of_reads_each_family() -> None:
    layers = {"num_hidden_layers": 4, "sliding_window": 8}
    assert [sliding_window_of(layers, i) for i in range(4)] == [8] * 4  # Mistral, Phi-3
    qwen = {**layers, "use_sliding_window": True, "max_window_layers": 2}
    assert [sliding_window_of(qwen, i) for i in range(4)] == [None, None, 8, 8]
    assert full_attention_limit({**qwen, "use_sliding_window": False}) is None
    typed = {**layers, "layer_types": ["full_attention", "sliding_attention"] * 2}
    assert [sliding_window_of(typed, i) for i in range(4)] == [None, 8, None, 8]
    assert full_attention_limit(typed) == 8
    hf_qwen2 = transformers.Qwen2Config(**{**TINY, "num_hidden_layers": 4}, use_sliding_window=True, sliding_window=6, max_window_layers=3)
    cfg = hf_qwen2.to_dict()
    assert [sliding_window_of(cfg, i) for i in range(4)] == [hf_qwen2.sliding_window if t == "sliding_attention" else None
                                                              for t in hf_qwen2.layer_types]


def test_fused_partial_rotary_model_on_the_paged_cache() -> None:
    """Phi-3 layout through the real torch backend: a prefill of 9 tokens, then decode steps
    one token at a time (the decode buffer's path), logits equal to transformers' at every
    position of the whole sequence."""
    rope = {"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0, 1.2, 1.5, 2.0], "long_factor": [1.0, 2.0, 4.0, 8.0]}
    hf = _hf("Phi3ForCausalLM", partial_rotary_factor=0.5, original_max_position_embeddings=16, rope_parameters=rope)
    lm = _ours(hf, fused_qkv=True, fused_gate_up=True)
    ids = torch.randint(3, TINY["vocab_size"], (LENGTH,), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(_paged_logits(lm, ids, first=9), hf(input_ids=ids[None]).logits[0], atol=1e-5, rtol=1e-5)


def _paged_logits(lm: DecoderLM, ids: torch.Tensor, first: int) -> torch.Tensor:
    """Logits at every position of one row through the torch backend on a paged cache: a
    prefill of ``first`` tokens, then one token a step (the decode buffer's path)."""
    from mstar.attention import AttentionBatch, AttentionRow, TorchAttentionBackend
    from mstar.kv import KVCacheManager

    layout = lm.kv_cache_layout()
    kv = KVCacheManager(layout.num_layers, layout.num_kv_heads, layout.head_dim, block_size=4, num_blocks=16)
    backend = TorchAttentionBackend(kv, decode_buffer=True)
    got, start = [], 0
    with torch.no_grad():
        for n in (first, *[1] * (ids.numel() - first)):
            assert kv.append("r", "main", n)
            batch = AttentionBatch.build([AttentionRow("r", "main", n)], kv, "cpu")
            backend.plan(batch)
            got.append(lm.logits(lm.hidden_states(ids[start : start + n], batch.positions, backend)))
            start += n
    return torch.cat(got)


def test_tied_head_stays_tied_through_a_meta_device_build() -> None:
    hf = _hf("LlamaForCausalLM", tie_word_embeddings=True)
    with torch.device("meta"):
        lm = DecoderLM(hf.config.to_dict())
    lm = lm.to_empty(device="cpu").eval()
    assert lm.lm_head.weight is lm.model.embed_tokens.weight
    load_weights(lm, StateDictSource({k: v for k, v in hf.state_dict().items() if k != "lm_head.weight"}, "hf"))
    _assert_same_logits(hf, lm)
