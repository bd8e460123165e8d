"""Sampling: one parameter contract and seed-reproducible samplers for every model."""

from mstar.sampling.counter_rng import random_bits, uniform
from mstar.sampling.multi import MAIN_LABEL, MultiSamplingConfig, UnknownSamplerLabelError
from mstar.sampling.multi_sampler import BatchSampler, MultiSampler
from mstar.sampling.params import MAX_TOP_LOGPROBS, SamplingParams
from mstar.sampling.seeds import MAX_SEED, derive_seed, fresh_seed
from mstar.sampling.slot_sampler import SlotSampler
from mstar.sampling.tensors import SampleOutput, SamplingTensors, token_counts, token_mask

__all__ = [
    "MAIN_LABEL",
    "MAX_SEED",
    "MAX_TOP_LOGPROBS",
    "BatchSampler",
    "MultiSampler",
    "MultiSamplingConfig",
    "SampleOutput",
    "SamplingParams",
    "SamplingTensors",
    "SlotSampler",
    "UnknownSamplerLabelError",
    "derive_seed",
    "fresh_seed",
    "random_bits",
    "token_counts",
    "token_mask",
    "uniform",
]
