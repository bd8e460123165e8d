"""``packed_linear``: linears through MKL's packed weights compute what ``F.linear`` does,
give a row the same bits whatever the rest of its batch, follow in-place weight changes,
stay out of autograd, and are what an engine on CPU runs."""

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
    pack_linears,
    packed_copy,
    packed_linear,
)

pytestmark = pytest.mark.skipif(not packed.available(), reason="this torch build has no MKL packed linear")


def _rand(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _layer(seed: int = 0, bias: bool = True) -> nn.Linear:
    torch.manual_seed(seed)
    return nn.Linear(96, 384, bias=bias)


@pytest.mark.parametrize("rows", [1, 15, 16, 20, 32, 33, 64])
def test_packed_layer_equals_linear(rows):
    layer = _layer()
    x = _rand(rows, 96, seed=rows)
    with torch.no_grad():
        want = F.linear(x, layer.weight, layer.bias)
    pack_linears(layer)
    with torch.inference_mode():
        got = layer(x)
    assert got.shape == want.shape and got.is_contiguous()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_leading_dims_without_bias():
    layer = _layer(bias=False)
    x = _rand(2, 10, 96, seed=1)  # 20 rows: the packed range
    with torch.inference_mode():
        got = packed_linear(x, layer.weight)
        torch.testing.assert_close(got, F.linear(x, layer.weight), rtol=1e-5, atol=1e-5)
    assert got.shape == (2, 10, 384)


def test_a_row_gets_the_same_bits_whatever_its_batch():
    # Every packed call has PACK_ROWS rows, so a row's arithmetic cannot depend on how many
    # real rows share it (plain F.linear gives this shape different bits at 1 and 32 rows).
    layer = _layer(seed=2)
    x = _rand(packed.PACK_ROWS, 96, seed=3)
    with torch.inference_mode():
        full = packed_linear(x, layer.weight, layer.bias)
        for n in (1, 5, 17, 31):
            assert torch.equal(packed_linear(x[:n], layer.weight, layer.bias), full[:n]), n
        assert torch.equal(packed_linear(x[7:8], layer.weight, layer.bias)[0], full[7])


def test_in_place_weight_change_is_followed():
    layer = _layer(seed=4)
    pack_linears(layer)
    x = _rand(24, 96, seed=5)
    with torch.inference_mode():
        layer(x)  # packs the weight
    with torch.no_grad():
        layer.weight.mul_(-2.0)
    with torch.inference_mode():
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)


def test_autograd_takes_plain_linear():
    layer = _layer(seed=6)
    pack_linears(layer)
    x = _rand(24, 96, seed=7).requires_grad_()
    layer(x).sum().backward()
    assert x.grad is not None and layer.weight.grad is not None
    torch.testing.assert_close(x.grad, layer.weight.sum(0).expand(24, -1))


def test_pack_linears_changes_only_plain_float32_linears():
    class Custom(nn.Linear):
        pass

    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Sequential(nn.Linear(8, 4)), Custom(4, 4), nn.Linear(4, 4).double())
    keys = list(model.state_dict())
    assert pack_linears(model) == 2
    assert [type(m).__name__ for m in model] == ["PackedLinear", "ReLU", "Sequential", "Custom", "Linear"]
    assert type(model[2][0]) is PackedLinear
    assert list(model.state_dict()) == keys


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

    ckpt = write_checkpoint(tmp_path / "toy")
    engine = Engine.from_model("toy", weights=ckpt, kv_budget_bytes=8 << 20, cpu_packed_linears=on)
    try:
        mods = [m for node in engine.core.nodes.values() for m in node.submodule.modules()]
        linears = [m for m in mods if isinstance(m, nn.Linear)]
        assert linears and all((type(m) is PackedLinear) == on for m in linears)
        embeddings = [m for m in mods if isinstance(m, nn.Embedding)]
        assert embeddings and all(claimed(m.weight) == on for m in linears + embeddings)
        out = engine.run_batch([{"inputs": {"prompt_ids": torch.arange(3, 40) % 200}, "sampling": {"main": {"temperature": 0, "max_tokens": 4}}}])
        assert out[0].error is None and len(out[0].cat("token")) == 4
    finally:
        engine.close()
