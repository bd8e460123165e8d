"""Random parameter mixes shared by the determinism and equivalence tests."""

from __future__ import annotations

import random

from mstar.sampling import SamplingParams


def random_params(rng: random.Random, *, history: bool = True) -> SamplingParams:
    """A random but valid mix; ``history`` enables penalties and min_tokens."""
    logprobs = rng.random() < 0.5
    return SamplingParams(
        temperature=rng.choice([0.0, 0.3, 0.7, 1.0, 1.0, 1.6]),
        top_k=rng.choice([-1, 0, 1, 3, 20, 10_000]),
        top_p=rng.choice([1.0, 1.0, 0.95, 0.6, 0.25]),
        min_p=rng.choice([0.0, 0.0, 0.05, 0.3]),
        repetition_penalty=rng.choice([1.0, 1.0, 1.3, 0.8]) if history else 1.0,
        presence_penalty=rng.choice([0.0, 0.0, 0.6, -0.5]) if history else 0.0,
        frequency_penalty=rng.choice([0.0, 0.0, 0.4, -0.3]) if history else 0.0,
        min_tokens=rng.choice([0, 0, 2, 5]) if history else 0,
        max_tokens=16,
        stop_token_ids=rng.sample(range(8), rng.randint(0, 2)),
        logprobs=logprobs,
        top_logprobs=rng.choice([0, 1, 4]) if logprobs else 0,
    )
