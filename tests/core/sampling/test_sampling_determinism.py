"""A row's draw depends only on its own inputs and (seed, step), never on its batch."""

import random

import pytest
import torch
from mstar.sampling import SamplingParams, SamplingTensors, token_counts, token_mask
from sampling_helpers import Sampler, random_params

V = 1000


def _sample(rows, logits, seeds, steps, outputs, prompts, stops):
    st = SamplingTensors.from_rows(rows, seeds, steps)
    return Sampler().sample(
        logits,
        st,
        output_counts=token_counts(outputs, V),
        prompt_mask=token_mask(prompts, V),
        stop_mask=token_mask(stops, V),
    )


def _random_row(rng: random.Random, gen: torch.Generator):
    params = random_params(rng)
    logits = torch.randn(V, generator=gen) * rng.choice([0.5, 2.0, 6.0])
    output = [rng.randrange(V) for _ in range(rng.randint(0, 6))]
    prompt = [rng.randrange(V) for _ in range(rng.randint(0, 6))]
    stop = params.min_tokens_stop_ids([rng.randrange(V)])
    return params, logits, rng.randrange(2**63), rng.randrange(8), output, prompt, stop


@pytest.mark.parametrize("trial", range(8))
def test_row_is_independent_of_batch_position_and_size(trial):
    rng = random.Random(trial)
    gen = torch.Generator().manual_seed(trial)
    target = _random_row(rng, gen)

    def run(batch):
        cols = list(zip(*batch, strict=True))
        return _sample(list(cols[0]), torch.stack(cols[1]), *cols[2:])

    alone = run([target])
    for size in (8, 33):
        for pos in (0, size // 2, size - 1):
            batch = [_random_row(rng, gen) for _ in range(size)]
            batch[pos] = target
            out = run(batch)
            assert out.tokens[pos] == alone.tokens[0], (size, pos)
            if target[0].logprobs:  # logprobs are computed only when some row asks
                assert torch.equal(out.logprobs[pos], alone.logprobs[0])
            else:
                assert alone.logprobs[0].isnan()


def test_same_seed_and_step_give_same_token_and_steps_vary():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(1, V, generator=gen).expand(200, -1)
    rows = [SamplingParams(temperature=1.0)] * 200
    st = SamplingTensors.from_rows(rows, [77] * 200, steps=range(200))
    first = Sampler().sample(logits, st).tokens
    again = Sampler().sample(logits.clone(), st).tokens
    assert torch.equal(first, again)
    assert len(set(first.tolist())) > 20  # steps index a real stream

    other_seed = SamplingTensors.from_rows(rows, [78] * 200, steps=range(200))
    assert not torch.equal(Sampler().sample(logits, other_seed).tokens, first)


def test_global_rng_state_is_irrelevant():
    logits = torch.randn(50, V, generator=torch.Generator().manual_seed(1))
    st = SamplingTensors.from_rows([SamplingParams(top_p=0.9)] * 50, range(50), [3] * 50)
    torch.manual_seed(0)
    a = Sampler().sample(logits, st).tokens
    torch.manual_seed(12345)
    torch.rand(1000)
    b = Sampler().sample(logits, st).tokens
    assert torch.equal(a, b)


def test_bf16_and_fp32_logits_accepted():
    logits = torch.randn(4, V, generator=torch.Generator().manual_seed(2))
    st = SamplingTensors.from_rows([SamplingParams()] * 4, range(4), [0] * 4)
    out = Sampler().sample(logits.to(torch.bfloat16), st)
    assert out.tokens.dtype == torch.int64 and out.logprobs.dtype == torch.float32
    ref = Sampler().sample(logits.to(torch.bfloat16).float(), st)
    assert torch.equal(out.tokens, ref.tokens)


def test_empty_batch():
    st = SamplingTensors.from_rows([], [], [])
    out = Sampler().sample(torch.empty(0, V), st)
    assert out.tokens.shape == (0,)
