"""``RMSNorm`` through torch's fused kernel (float32, CPU) gives exactly the bits of the
Llama-family formula, at any thread count."""

from __future__ import annotations

import pytest
import torch
from mstar.layers import RMSNorm
from mstar.layers.norm import rms_norm_formula


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("shape", [(8, 1, 128), (8, 1, 4, 32), (3, 256), (37, 6, 8), (5, 24), (2, 7, 1024), (1, 2048)])
def test_rms_norm_equals_the_reference_formula(shape, threads) -> None:
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        gen = torch.Generator().manual_seed(sum(shape))
        ours = RMSNorm(shape[-1], 1e-6)
        with torch.no_grad():
            ours.weight.copy_(torch.randn(shape[-1], generator=gen))
        for scale in (1e-3, 1.0, 40.0):
            x = torch.randn(shape, generator=gen) * scale
            assert torch.equal(ours(x), rms_norm_formula(x, ours.weight, 1e-6))
    finally:
        torch.set_num_threads(before)
