"""Eager sampler: per-row parameters and history are passed in with each call."""

from __future__ import annotations

from torch import Tensor

from mstar.sampling.kernel import sample_batch
from mstar.sampling.tensors import SampleOutput, SamplingTensors


class Sampler:
    """Stateless eager sampler; see ``mstar.sampling.kernel`` for the order of operations.

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
