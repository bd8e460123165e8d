"""``vocab_logits``: the LM head in the orientation that is cheaper on CPU computes what
``F.linear`` does, for every row count and input shape, and hands the sampler a
contiguous [rows, V] tensor."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from mstar.layers import vocab_logits

VOCAB, HIDDEN = 20_000, 64  # over the size where the other orientation is used


@pytest.fixture(scope="module")
def weight() -> torch.Tensor:
    return torch.randn(VOCAB, HIDDEN, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("rows", [1, 2, 7, 32, 300])
def test_equals_linear(weight, rows):
    h = torch.randn(rows, HIDDEN, generator=torch.Generator().manual_seed(rows))
    out = vocab_logits(h, weight)
    assert out.shape == (rows, VOCAB) and out.is_contiguous()
    torch.testing.assert_close(out, F.linear(h, weight), rtol=1e-5, atol=1e-5)


def test_leading_dims_and_bias(weight):
    h = torch.randn(3, 5, HIDDEN, generator=torch.Generator().manual_seed(1))
    bias = torch.randn(VOCAB, generator=torch.Generator().manual_seed(2))
    out = vocab_logits(h, weight, bias)
    assert out.shape == (3, 5, VOCAB) and out.is_contiguous()
    torch.testing.assert_close(out, F.linear(h, weight, bias), rtol=1e-5, atol=1e-5)


def test_rows_do_not_depend_on_their_neighbours_beyond_float_order(weight):
    # The sampler sees each row's logits; a row must not pick up another row's values.
    h = torch.randn(16, HIDDEN, generator=torch.Generator().manual_seed(3))
    together = vocab_logits(h, weight)
    for i in (0, 9, 15):
        torch.testing.assert_close(together[i], F.linear(h[i], weight), rtol=1e-5, atol=1e-5)


def test_small_vocabulary_is_plain_linear():
    w = torch.randn(300, HIDDEN, generator=torch.Generator().manual_seed(4))
    h = torch.randn(8, HIDDEN, generator=torch.Generator().manual_seed(5))
    assert torch.equal(vocab_logits(h, w), F.linear(h, w))
