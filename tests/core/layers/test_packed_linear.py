"""``packed_linear``: linears through oneDNN's packed weights compute what ``F.linear``
does, give a row the same bits whatever the rest of its batch, follow in-place weight
changes, stay out of autograd, leave small weights alone, and are what an engine on CPU
runs."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from mstar.layers import packed_linear as packed
from mstar.layers import vocab_logits
from mstar.layers.packed_linear import (
    PackedLinear,
    claimed,
    linear,
    pack_linears,
    packed_copy,
    packed_linear,
)

pytestmark = pytest.mark.skipif(not packed.available(), reason="this torch build has no oneDNN packed linear")


def _rand(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _layer(seed: int = 0, bias: bool = True) -> nn.Linear:
    torch.manual_seed(seed)
    return nn.Linear(192, 384, bias=bias)  # 73,728 weights: at least MIN_PACK_ELEMENTS


@pytest.mark.parametrize("rows", [1, 7, 16, 33, 300])
def test_packed_layer_equals_linear(rows):
    layer = _layer()
    x = _rand(rows, 192, seed=rows)
    with torch.no_grad():
        want = F.linear(x, layer.weight, layer.bias)
    pack_linears(layer)
    with torch.inference_mode():
        got = layer(x)
    assert got.shape == want.shape and got.is_contiguous()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_leading_dims_without_bias():
    layer = _layer(bias=False)
    x = _rand(2, 10, 192, seed=1)
    with torch.inference_mode():
        got = packed_linear(x, layer.weight)
        torch.testing.assert_close(got, F.linear(x, layer.weight), rtol=1e-5, atol=1e-5)
    assert got.shape == (2, 10, 384)


@pytest.mark.parametrize("shape", [(384, 192), (1000, 70), (257, 513)])
def test_a_row_gets_the_same_bits_whatever_its_batch(shape):
    # A row's arithmetic must not depend on how many rows share its call (plain F.linear
    # gives rows different bits at different row counts on some CPUs).
    torch.manual_seed(2)
    weight, bias = torch.randn(*shape) * 0.1, torch.randn(shape[0])
    x = _rand(300, shape[1], seed=3)
    with torch.inference_mode():
        alone = torch.cat([packed_linear(x[i : i + 1], weight, bias) for i in range(300)])
        for n in (2, 5, 8, 17, 31, 32, 33, 64, 100, 300):
            assert torch.equal(packed_linear(x[:n], weight, bias), alone[:n]), n
        assert torch.equal(packed_linear(x[150:190], weight, bias), alone[150:190])


def test_in_place_weight_change_is_followed():
    layer = _layer(seed=4)
    pack_linears(layer)
    x = _rand(24, 192, seed=5)
    with torch.inference_mode():
        layer(x)  # packs the weight
    with torch.no_grad():
        layer.weight.mul_(-2.0)
    with torch.inference_mode():
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)


def test_autograd_takes_plain_linear():
    layer = _layer(seed=6)
    pack_linears(layer)
    x = _rand(24, 192, seed=7).requires_grad_()
    layer(x).sum().backward()
    assert x.grad is not None and layer.weight.grad is not None
    torch.testing.assert_close(x.grad, layer.weight.sum(0).expand(24, -1))


def test_pack_linears_changes_only_plain_float32_linears():
    class Custom(nn.Linear):
        pass

    model = nn.Sequential(
        nn.Linear(256, 256), nn.ReLU(), nn.Sequential(nn.Linear(256, 512)), Custom(256, 256),
        nn.Linear(256, 256).double(), nn.Linear(256, 255),  # 65,280 weights: below MIN_PACK_ELEMENTS
    )
    keys = list(model.state_dict())
    assert pack_linears(model) == 2
    assert [type(m).__name__ for m in model] == ["PackedLinear", "ReLU", "Sequential", "Custom", "Linear", "Linear"]
    assert type(model[2][0]) is PackedLinear
    assert not claimed(model[5].weight) and claimed(model[0].weight)
    assert list(model.state_dict()) == keys


def test_linear_packs_only_a_claimed_weight():
    # What model code that computes layers from their parameters calls (the Qwen3-TTS talker).
    layer, other = _layer(seed=9), _layer(seed=10)
    x = _rand(8, 192, seed=11)
    pack_linears(layer)
    with torch.inference_mode():
        got, plain = linear(x, layer.weight, layer.bias), linear(x, other.weight, other.bias)
    assert packed_copy(layer.weight) is not None and packed_copy(other.weight) is None
    torch.testing.assert_close(got, F.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)
    assert torch.equal(plain, F.linear(x, other.weight, other.bias))


def test_vocab_head_packs_only_a_claimed_weight():
    embed = nn.Embedding(20_000, 64)  # a tied head: the embedding's weight
    h = _rand(8, 64, seed=8)
    with torch.inference_mode():
        want = F.linear(h, embed.weight)
        torch.testing.assert_close(vocab_logits(h, embed.weight), want, rtol=1e-5, atol=1e-5)
        assert packed_copy(embed.weight) is None  # never claimed: the plain path
        assert pack_linears(embed) == 0 and claimed(embed.weight)
        got = vocab_logits(h, embed.weight)
    assert packed_copy(embed.weight) is not None
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("on", [True, False])
def test_engine_packs_its_cpu_nodes(tmp_path, on):
    from mstar import Engine
    from mstar_toy.checkpoint import write_checkpoint

    ckpt = write_checkpoint(tmp_path / "toy", hidden_size=256, intermediate_size=512)
    engine = Engine.from_model("toy", weights=ckpt, kv_budget_bytes=8 << 20, cpu_packed_linears=on)
    try:
        mods = [m for node in engine.core.nodes.values() for m in node.submodule.modules()]
        big = [m for m in mods if isinstance(m, nn.Linear | nn.Embedding) and m.weight.numel() >= packed.MIN_PACK_ELEMENTS]
        small = [m for m in mods if isinstance(m, nn.Linear | nn.Embedding) and m.weight.numel() < packed.MIN_PACK_ELEMENTS]
        assert any(isinstance(m, nn.Linear) for m in big) and small
        assert all((type(m) is PackedLinear) == on for m in big if isinstance(m, nn.Linear))
        assert all(claimed(m.weight) == on for m in big) and not any(claimed(m.weight) for m in small)
        assert not any(type(m) is PackedLinear for m in small)
        out = engine.run_batch([{"inputs": {"prompt_ids": torch.arange(3, 40) % 200}, "sampling": {"main": {"temperature": 0, "max_tokens": 4}}}])
        assert out[0].error is None and len(out[0].cat("token")) == 4
    finally:
        engine.close()
