"""``mstar.layers.codec_blocks.snake``: the in-place form (autograd off) computes the same
bits as the plain formula the reference vocoders write, and keeps autograd working."""

from __future__ import annotations

import pytest
import torch
from mstar.layers.codec_blocks import SnakeBeta, snake


def formula(x: torch.Tensor, freq: torch.Tensor, inv_scale: torch.Tensor) -> torch.Tensor:
    return x + inv_scale * torch.sin(x * freq).pow(2)


@pytest.mark.parametrize("shape", [(1, 8, 5), (3, 64, 4800), (2, 256, 80)])
def test_in_place_snake_is_bit_identical(shape):
    g = torch.Generator().manual_seed(sum(shape))
    x = torch.randn(shape, generator=g) * 4
    freq = torch.randn(1, shape[1], 1, generator=g).exp()
    inv = 1.0 / (torch.randn(1, shape[1], 1, generator=g).exp() + 1e-9)
    keep = x.clone()
    with torch.no_grad():
        got = snake(x, freq, inv)
    assert torch.equal(got, formula(x, freq, inv))
    assert torch.equal(x, keep)  # the input is not written


def test_snake_beta_module_matches_the_reference_formula():
    m = SnakeBeta(16)
    with torch.no_grad():
        m.alpha.normal_(0, 0.5)
        m.beta.normal_(0, 0.5)
    x = torch.randn(2, 16, 300)
    want = x + (1.0 / (m.beta.exp()[None, :, None] + 1e-9)) * torch.sin(x * m.alpha.exp()[None, :, None]).pow(2)
    with torch.inference_mode():
        got = m(x)
    assert torch.equal(got, want.detach())


def test_snake_with_autograd_still_differentiates():
    x = torch.randn(2, 4, 10, requires_grad=True)
    freq = torch.rand(1, 4, 1) + 0.5
    inv = torch.rand(1, 4, 1) + 0.5
    snake(x, freq, inv).sum().backward()
    want = 1 + inv * torch.sin(2 * x.detach() * freq) * freq  # d/dx of x + inv sin²(fx)
    torch.testing.assert_close(x.grad, want)
