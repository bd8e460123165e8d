"""Random parameter mixes shared by the determinism and equivalence tests, and the eager
``Sampler`` they compare the engine's sampler with."""

from __future__ import annotations

import random

from mstar.sampling import SampleOutput, SamplingParams, SamplingTensors
from mstar.sampling.kernel import sample_batch
from torch import Tensor


class Sampler:
    """Stateless eager sampler (test reference); see ``mstar.sampling.kernel`` for the order
    of operations. Per-row parameters and history come with each call, where ``SlotSampler``
    keeps them per slot: the tests check that both draw the same tokens.

    History is optional: ``output_counts`` (int32 [B, V], occurrences of each token in
    the output so far) and ``prompt_mask`` (bool [B, V]) feed the penalties;
    ``stop_mask`` (bool [B, V], stop ids incl. EOS) feeds min_tokens suppression.
    None means that step has nothing to act on.
    """

    def sample(
        self,
        logits: Tensor,
        params: SamplingTensors,
        output_counts: Tensor | None = None,
        prompt_mask: Tensor | None = None,
        stop_mask: Tensor | None = None,
    ) -> SampleOutput:
        return sample_batch(logits, params, output_counts, prompt_mask, stop_mask)


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
