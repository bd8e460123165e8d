"""Edge cases of the kernel's building blocks that random draws almost never hit."""

import torch
from mstar.sampling import SamplingParams, SamplingTensors
from mstar.sampling.kernel import ceil_to_float32, inverse_cdf
from sampling_helpers import Sampler


def test_inverse_cdf_interval_edges():
    w = torch.tensor([[0.25, 0.25, 0.5]] * 5, dtype=torch.float32)
    u = torch.tensor([0.0, 0.2499, 0.25, 0.5, 0.9999], dtype=torch.float64)
    # Token i owns [cdf[i-1], cdf[i]): a u exactly on a boundary belongs to the next token.
    assert inverse_cdf(w, u).tolist() == [0, 0, 1, 2, 2]


def test_inverse_cdf_never_returns_zero_weight_index():
    w = torch.tensor([[0.0, 0.5, 0.0, 0.5, 0.0, 0.0]] * 4)
    u = torch.tensor([0.0, 0.5, 1.0 - 2**-53, 1.0], dtype=torch.float64)
    # u == 1.0 cannot come from `uniform` but exercises the clamp-and-fallback path.
    assert inverse_cdf(w, u).tolist() == [1, 3, 3, 3]


def test_boundary_ties_are_all_kept_and_at_least_one_token():
    logits = torch.tensor([0.3, 0.2, 0.2, 0.2, 0.1]).log()
    n = 2000
    rows = [SamplingParams(top_k=2)] * n + [SamplingParams(top_p=0.01)] * n
    st = SamplingTensors.from_rows(rows, range(2 * n), [0] * (2 * n))
    tokens = Sampler().sample(logits.expand(2 * n, -1), st).tokens
    # top_k=2 cuts inside a three-way tie: all three tied tokens stay, token 4 never.
    assert set(tokens[:n].tolist()) == {0, 1, 2, 3}
    assert set(tokens[n:].tolist()) == {0}


def test_ceil_to_float32_is_exact():
    x = torch.tensor([0.1, 0.5, 1 / 3, 2.0**-30 * 3], dtype=torch.float64)
    c = ceil_to_float32(x)
    assert c.dtype == torch.float32
    assert torch.all(c.double() >= x)
    below = torch.nextafter(c, torch.zeros_like(c))
    assert torch.all(below.double() < x)
