"""Counter-based RNG: bit-exact SplitMix64, a pure function of (seed, step)."""

import torch
from mstar.sampling import MAX_SEED, random_bits, uniform
from mstar.sampling.counter_rng import mix64, uniform_host
from sampling_reference import GAMMA, U64, counter_bits, splitmix64_mix


def test_mix64_matches_published_splitmix64_vector():
    # First outputs of SplitMix64 seeded with 0 (reference C implementation).
    def signed(v: int) -> int:
        return v - (1 << 64) if v >= 1 << 63 else v

    state = torch.tensor([signed(GAMMA), signed(2 * GAMMA & U64)])
    got = [v & U64 for v in mix64(state).tolist()]
    assert got == [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4]


def test_random_bits_match_python_reference():
    seeds = [0, 1, 2, 42, 2**32 + 7, 2**62 + 12345, MAX_SEED, 987654321987654321]
    steps = [0, 1, 2, 1000, 2**31, 2**40 + 3]
    s = torch.tensor([a for a in seeds for _ in steps])
    t = torch.tensor([b for _ in seeds for b in steps])
    got = [v & U64 for v in random_bits(s, t).tolist()]
    want = [counter_bits(a, b) for a in seeds for b in steps]
    assert got == want
    assert splitmix64_mix(0) == 0  # sanity of the reference itself


def test_uniform_range_and_moments():
    n = 200_000
    u = uniform(torch.full((n,), 7), torch.arange(n))
    assert u.dtype == torch.float64
    assert float(u.min()) >= 0.0 and float(u.max()) < 1.0
    # Mean 1/2 (sd 0.00065) and variance 1/12 within ~6 sigma.
    assert abs(float(u.mean()) - 0.5) < 0.004
    assert abs(float(u.var()) - 1 / 12) < 0.002
    # Ten equal bins each hold 10% +- 0.5% (sd 0.067%).
    hist = torch.histc(u.float(), bins=10, min=0, max=1) / n
    assert float((hist - 0.1).abs().max()) < 0.005


def test_uniform_is_elementwise_in_seed_and_step():
    seeds = torch.tensor([3, 3, 4, 5, MAX_SEED])
    steps = torch.tensor([0, 1, 0, 9, 123])
    batch = uniform(seeds, steps)
    for i in range(5):
        alone = uniform(seeds[i : i + 1], steps[i : i + 1])
        assert torch.equal(alone, batch[i : i + 1])
    # Different seed or step -> different value.
    assert len(set(batch.tolist())) == 5


def test_uniform_host_equals_uniform_bit_for_bit():
    # Edge seeds (0, -1, the int64 extremes) and steps near the wrap-around of step + 1.
    gen = torch.Generator().manual_seed(5)
    seeds = [0, 1, -1, MAX_SEED, -(2**63), 2**63 - 1, *torch.randint(-(2**63), 2**63 - 1, (200,), generator=gen).tolist()]
    steps = [0, 1, 2**63 - 2, 2**40 + 3, *torch.randint(0, 2**62, (202,), generator=gen).tolist()]
    want = uniform(torch.tensor(seeds), torch.tensor(steps)).tolist()
    got = uniform_host(seeds, steps)
    assert [w.hex() for w in want] == [g.hex() for g in got]
