"""SlotSampler (the per-slot sampler of every device): identical to the eager Sampler;
slot state and counters."""

import random

import pytest
import torch
from mstar.sampling import (
    SamplingParams,
    SamplingTensors,
    SlotSampler,
    token_counts,
    token_mask,
)
from sampling_helpers import Sampler, random_params


class Mirror:
    """The test's own record of each slot's request, for building eager inputs."""

    def __init__(self, params, seed, prompt, stop):
        self.params, self.seed, self.prompt = params, seed, prompt
        self.stop = sorted(set(stop) | set(params.stop_token_ids))
        self.output: list[int] = []


@pytest.mark.parametrize("trial", range(24))
def test_slot_sampler_matches_eager(trial):
    rng = random.Random(1000 + trial)
    gen = torch.Generator().manual_seed(trial)
    vocab = rng.choice([9, 64, 257])
    max_slots = 12
    graph = SlotSampler(max_slots, vocab)
    mirror: dict[int, Mirror] = {}
    history = trial % 3 != 0  # some trials never allocate history buffers

    def add(slot):
        params = random_params(rng, history=history)
        seed = rng.randrange(2**63)
        prompt = [rng.randrange(vocab) for _ in range(rng.randint(0, 5))]
        stop = [rng.randrange(vocab)]
        graph.add_request(slot, params, seed, prompt, stop)
        mirror[slot] = Mirror(params, seed, prompt, stop)

    for slot in rng.sample(range(max_slots), rng.randint(1, max_slots)):
        add(slot)

    for step in range(8):
        if step == 4:  # churn: free one slot, reuse another
            gone = rng.choice(sorted(mirror))
            graph.remove_request(gone)
            del mirror[gone]
            add(rng.choice([s for s in range(max_slots) if s not in mirror]))
        active = sorted(mirror)
        batch = rng.sample(active, rng.randint(1, len(active)))
        slot_ids = torch.tensor(batch)
        advance = torch.tensor([rng.random() < 0.8 for _ in batch])
        logits = torch.randn(len(batch), vocab, generator=gen) * rng.choice([1.0, 4.0])

        rows = [mirror[s] for s in batch]
        params = [m.params for m in rows]
        st = SamplingTensors.from_rows(
            params, [m.seed for m in rows], [len(m.output) for m in rows]
        )
        penalties = any(p.uses_penalties for p in params)
        eager = Sampler().sample(
            logits,
            st,
            output_counts=token_counts([m.output for m in rows], vocab) if penalties else None,
            prompt_mask=token_mask([m.prompt for m in rows], vocab) if penalties else None,
            stop_mask=(
                token_mask([m.stop for m in rows], vocab)
                if any(p.min_tokens for p in params) else None
            ),
        )
        got = graph.sample(logits, slot_ids, advance)

        assert torch.equal(got.tokens, eager.tokens), (trial, step)
        # Logprobs exist for the rows that asked (the two hint from different row sets).
        asked = torch.tensor([p.logprobs for p in params], dtype=torch.bool)
        assert torch.equal(got.logprobs[asked], eager.logprobs[asked])
        if eager.top_logprob_ids is not None:
            n = eager.top_logprob_ids.shape[1]
            assert torch.equal(got.top_logprob_ids[:, :n], eager.top_logprob_ids)
            assert torch.equal(got.top_logprob_values[:, :n], eager.top_logprob_values)

        for m, tok, adv in zip(rows, got.tokens.tolist(), advance.tolist(), strict=True):
            if adv:
                m.output.append(tok)

    steps = graph.step_counters
    for slot, m in mirror.items():
        assert steps[slot] == len(m.output)
    counts = graph.output_counts
    if counts is not None:
        for slot, m in mirror.items():
            assert torch.equal(counts[slot], token_counts([m.output], vocab)[0])


def test_step_counter_and_advance_mask():
    g = SlotSampler(4, 32)
    g.add_request(1, SamplingParams(), seed=5)
    g.add_request(3, SamplingParams(), seed=6)
    logits = torch.randn(2, 32, generator=torch.Generator().manual_seed(0))
    slots = torch.tensor([3, 1])
    first = g.sample(logits, slots, advance=torch.tensor([True, False]))
    assert g.step_counters.tolist() == [0, 0, 0, 1]
    second = g.sample(logits, slots)
    assert g.step_counters.tolist() == [0, 1, 0, 2]
    # Slot 1 did not advance, so it redrew at step 0: same token.
    assert second.tokens[1] == first.tokens[1]
    # Slot 3 matches the eager stream at steps 0 and 1.
    st = SamplingTensors.from_rows([SamplingParams()] * 2, [6, 6], [0, 1])
    eager = Sampler().sample(logits[[0, 0]], st)
    assert eager.tokens.tolist() == [first.tokens[0].item(), second.tokens[0].item()]


def test_history_buffers_are_lazy():
    g = SlotSampler(4, 156_000)
    g.add_request(0, SamplingParams(top_k=5), seed=1)
    assert g.output_counts is None and g._stop_mask is None
    g.add_request(1, SamplingParams(min_tokens=2), seed=1, stop_ids=[0])
    assert g.output_counts is None and g._stop_mask is not None
    g.add_request(2, SamplingParams(presence_penalty=0.5), seed=1)
    assert g.output_counts is not None and g.output_counts.shape == (4, 156_000)


def test_slot_reuse_resets_history():
    vocab = 16
    logits = torch.zeros(1, vocab)
    params = SamplingParams(frequency_penalty=2.0, repetition_penalty=1.5, min_tokens=3)

    def run(g):
        g.add_request(2, params, seed=9, prompt_ids=[1, 2, 3], stop_ids=[4])
        toks = [g.sample(logits, torch.tensor([2])).tokens.item() for _ in range(6)]
        g.remove_request(2)
        return toks

    g = SlotSampler(4, vocab)
    first = run(g)
    assert run(g) == first
    assert 4 not in first[:3]


def test_registration_errors():
    g = SlotSampler(2, 8)
    g.add_request(0, SamplingParams(), seed=1)
    with pytest.raises(ValueError, match="already in use"):
        g.add_request(0, SamplingParams(), seed=1)
    with pytest.raises(IndexError):
        g.add_request(2, SamplingParams(), seed=1)
    with pytest.raises(KeyError):
        g.remove_request(1)
    with pytest.raises(ValueError, match="token ids"):
        g.add_request(1, SamplingParams(repetition_penalty=1.1), seed=1, prompt_ids=[8])
    with pytest.raises(ValueError, match=r"\[B, 8\]"):
        g.sample(torch.zeros(1, 9), torch.tensor([0]))


def test_restore_undoes_the_penalty_history():
    # A failed step is undone by restore: the next draws equal those after the snapshot.
    vocab = 50
    graph = SlotSampler(4, vocab)
    params = SamplingParams(temperature=1.0, repetition_penalty=3.0, frequency_penalty=1.5)
    for slot in range(3):
        graph.add_request(slot, params, seed=slot, prompt_ids=[1, 2])
    slots = torch.tensor([2, 0, 1])
    logits = torch.randn(3, vocab, generator=torch.Generator().manual_seed(0))

    def run(n):
        return [graph.sample(logits, slots).tokens.tolist() for _ in range(n)]

    run(3)
    snap = graph.snapshot(slots)
    first = run(4)
    graph.restore(slots, snap)
    assert run(4) == first


def test_repeated_slot_ids_draw_as_fresh_ones_and_see_slot_changes():
    """Draws with one ``slot_ids`` object several times (a depth loop) equal draws with a new
    tensor each time, also after a slot of the batch was re-registered with other params."""
    vocab, gen = 64, torch.Generator().manual_seed(3)
    logits = [torch.randn(2, vocab, generator=gen) for _ in range(6)]
    hot, cold = SlotSampler(4, vocab), SlotSampler(4, vocab)
    first = [SamplingParams(temperature=0.9, top_k=5), SamplingParams(temperature=0.0)]
    later = SamplingParams(temperature=1.3, top_p=0.8)
    for s in (hot, cold):
        for slot, p in enumerate(first):
            s.add_request(slot, p, seed=11 + slot)
    slots = torch.tensor([0, 1])
    got, want = [], []
    for i, x in enumerate(logits):
        if i == 3:  # slot 1 changes hands between two draws of the same batch
            for s in (hot, cold):
                s.remove_request(1)
                s.add_request(1, later, seed=99)
        got.append(hot.sample(x, slots).tokens)
        want.append(cold.sample(x, torch.tensor([0, 1])).tokens)
    assert [t.tolist() for t in got] == [t.tolist() for t in want]
    assert len({t[1] for t in torch.stack(want[3:]).tolist()}) > 1  # slot 1 sampled, not greedy
