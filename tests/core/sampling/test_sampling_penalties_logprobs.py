"""Penalties, min_tokens suppression and logprobs against hand-computed references."""

import numpy as np
import pytest
import torch
from mstar.sampling import SamplingParams, SamplingTensors, token_counts, token_mask
from sampling_helpers import Sampler
from sampling_reference import log_softmax, penalised_logits

LOGITS = [1.5, -0.5, 2.0, 0.0, -1.0, 0.75, 3.0, -2.0]
OUTPUT = [[2, 2, 5, 1], [6, 4], [0, 0, 0, 7, 3]]
PROMPT = [[1, 3], [6, 7, 0], []]


@pytest.mark.parametrize(
    ("rep", "presence", "frequency"),
    [(1.3, 0.0, 0.0), (0.8, 0.0, 0.0), (1.0, 0.5, 0.0), (1.0, 0.0, 0.4), (1.2, -0.7, 0.3)],
)
def test_penalties_match_reference(rep, presence, frequency):
    params = SamplingParams(
        repetition_penalty=rep, presence_penalty=presence, frequency_penalty=frequency,
        logprobs=True, top_logprobs=len(LOGITS), seed=1,
    )
    b, v = len(OUTPUT), len(LOGITS)
    st = SamplingTensors.from_rows([params] * b, seeds=None, steps=[0] * b)
    out = Sampler().sample(
        torch.tensor([LOGITS] * b),
        st,
        output_counts=token_counts(OUTPUT, v),
        prompt_mask=token_mask(PROMPT, v),
    )
    for row in range(b):
        want = log_softmax(penalised_logits(LOGITS, OUTPUT[row], PROMPT[row], rep, presence, frequency))
        got = np.empty(v)
        got[out.top_logprob_ids[row].numpy()] = out.top_logprob_values[row].numpy()
        np.testing.assert_allclose(got, want, atol=1e-5)


def test_penalties_change_greedy_choice_as_reference_says():
    # Token 6 (logit 3.0) seen twice in output: frequency 1.0 -> 1.0 < 2.0 (token 2).
    params = SamplingParams(temperature=0.0, frequency_penalty=1.0)
    st = SamplingTensors.from_rows([params, SamplingParams(temperature=0.0)], [0, 0], [0, 0])
    counts = token_counts([[6, 6], [6, 6]], len(LOGITS))
    out = Sampler().sample(torch.tensor([LOGITS] * 2), st, output_counts=counts)
    ref = penalised_logits(LOGITS, [6, 6], [], 1.0, 0.0, 1.0)
    assert out.tokens.tolist() == [int(np.argmax(ref)), 6]


def test_no_history_means_no_penalty():
    params = SamplingParams(repetition_penalty=2.0, presence_penalty=2.0, logprobs=True)
    st = SamplingTensors.from_rows([params], [0], [0])
    out = Sampler().sample(torch.tensor([LOGITS]), st)
    want = log_softmax(LOGITS)[int(out.tokens[0])]
    assert abs(float(out.logprobs[0]) - want) < 1e-5


def test_min_tokens_suppresses_stop_ids_until_reached():
    eos, stop = 6, 2  # the two largest logits
    rows = [SamplingParams(temperature=0.0, min_tokens=3, stop_token_ids=[stop], logprobs=True)] * 5
    stop_ids = [r.min_tokens_stop_ids([eos]) for r in rows]
    st = SamplingTensors.from_rows(rows, [0] * 5, steps=[0, 1, 2, 3, 4])
    out = Sampler().sample(
        torch.tensor([LOGITS] * 5), st, stop_mask=token_mask(stop_ids, len(LOGITS))
    )
    # While generated < 3, the best non-stop token (0, logit 1.5) wins.
    assert out.tokens.tolist() == [0, 0, 0, 6, 6]
    # Raw logprobs are taken after suppression: stop ids are excluded from the softmax.
    masked = [x if i not in (eos, stop) else float("-inf") for i, x in enumerate(LOGITS)]
    assert float(out.logprobs[0]) == pytest.approx(log_softmax(masked)[0], abs=1e-5)
    assert float(out.logprobs[3]) == pytest.approx(log_softmax(LOGITS)[6], abs=1e-5)


def test_min_tokens_suppression_in_sampled_rows():
    eos = 6
    rows = [SamplingParams(min_tokens=1, temperature=1.0)] * 2000
    st = SamplingTensors.from_rows(rows, range(2000), [0] * 2000)
    logits = torch.tensor([LOGITS] * 2000)
    logits[:, eos] = 10.0
    out = Sampler().sample(logits, st, stop_mask=token_mask([[eos]] * 2000, len(LOGITS)))
    assert not (out.tokens == eos).any()


def test_ignore_eos_does_not_suppress_eos():
    p = SamplingParams(temperature=0.0, min_tokens=2, ignore_eos=True)
    st = SamplingTensors.from_rows([p], [0], [0])
    mask = token_mask([p.min_tokens_stop_ids([6])], len(LOGITS))
    assert Sampler().sample(torch.tensor([LOGITS]), st, stop_mask=mask).tokens.item() == 6


def test_chosen_and_top_logprobs():
    torch.manual_seed(3)
    b, v = 16, 40
    logits = torch.randn(b, v) * 3
    rows = [
        SamplingParams(temperature=t, logprobs=True, top_logprobs=n, top_k=k)
        for t, n, k in zip([0.0, 0.5, 1.0, 2.0] * 4, [0, 1, 5, 7] * 4, [-1, 3, 10, 0] * 4, strict=True)
    ]
    st = SamplingTensors.from_rows(rows, list(range(b)), [4] * b)
    out = Sampler().sample(logits, st)
    assert out.top_logprob_ids.shape == (b, 7) and out.top_logprob_values.shape == (b, 7)
    for row in range(b):
        ref = log_softmax(logits[row].tolist())
        tok = int(out.tokens[row])
        assert abs(float(out.logprobs[row]) - ref[tok]) < 1e-5
        order = np.argsort(-ref, kind="stable")[:7]
        assert out.top_logprob_ids[row].tolist() == order.tolist()
        np.testing.assert_allclose(out.top_logprob_values[row].numpy(), ref[order], atol=1e-5)
        vals = out.top_logprob_values[row]
        assert torch.all(vals[:-1] >= vals[1:])


def test_no_top_logprobs_when_nobody_asked():
    st = SamplingTensors.from_rows([SamplingParams(logprobs=True)], [0], [0])
    out = Sampler().sample(torch.tensor([LOGITS]), st)
    assert out.top_logprob_ids is None and out.top_logprob_values is None
    assert out.logprobs.shape == (1,)


def test_sparse_penalties_equal_the_dense_formula():
    # The CPU applies penalties at the seen tokens only; the dense formula (used off the
    # CPU) runs every token through no-ops. Same values everywhere.
    from mstar.sampling.kernel import penalise_dense, penalise_seen

    gen = torch.Generator().manual_seed(4)
    b, v = 6, 500
    rows = [
        SamplingParams(repetition_penalty=1.3), SamplingParams(presence_penalty=0.7, frequency_penalty=-0.4),
        SamplingParams(), SamplingParams(repetition_penalty=0.8, frequency_penalty=1.1),
        SamplingParams(presence_penalty=-1.5), SamplingParams(repetition_penalty=2.0, presence_penalty=0.3),
    ]
    st = SamplingTensors.from_rows(rows, [0] * b, [0] * b)
    logits = torch.randn(b, v, generator=gen) * 3
    counts = (torch.rand(b, v, generator=gen) < 0.05).int() * torch.randint(1, 4, (b, v), generator=gen).int()
    prompt = torch.rand(b, v, generator=gen) < 0.03
    seen = (counts > 0) | prompt
    dense = penalise_dense(logits, st, seen, counts)
    sparse = penalise_seen(logits, st, seen, counts)
    assert torch.equal(dense, sparse)
    assert not torch.equal(sparse, logits)  # the case penalises something
    assert torch.equal(penalise_dense(logits, st, prompt, None), penalise_seen(logits, st, prompt, None))
