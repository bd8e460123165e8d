"""Seeds through the real engine: a seeded request's output never depends on its batch."""

from __future__ import annotations

import torch
from toy_reference import prompts

SEEDED = {"main": {"temperature": 1.0, "top_p": 0.95, "max_tokens": 16, "seed": 1234}, "aux": {"residual": {"temperature": 1.0}}}


def others(n: int, seed: int) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for p in prompts(n, seed=seed + 100):
        t = float(torch.rand((), generator=g)) * 1.5
        out.append({"inputs": {"prompt_ids": p}, "sampling": {"temperature": t, "top_k": int(torch.randint(0, 50, (), generator=g)), "max_tokens": int(torch.randint(4, 24, (), generator=g))}})
    return out


def result(r) -> tuple[list[int], torch.Tensor]:
    assert r.error is None, r.error
    return r.cat("token").tolist(), r.cat("audio")


def test_seeded_request_identical_over_repeats(make_engine):
    engine = make_engine()
    p = prompts(1, seed=9)[0]
    runs = [result(engine.run_batch([{"inputs": {"prompt_ids": p}, "sampling": SEEDED}])[0]) for _ in range(5)]
    assert len(runs[0][0]) > 0
    for toks, audio in runs[1:]:
        assert toks == runs[0][0]
        assert torch.equal(audio, runs[0][1])


def test_seeded_request_independent_of_batch_position(make_engine):
    engine = make_engine()
    p = prompts(1, seed=9)[0]
    target = {"inputs": {"prompt_ids": p}, "sampling": SEEDED}
    alone = result(engine.run_batch([target])[0])
    for n, pos in ((7, 0), (7, 3), (7, 7), (32, 0), (32, 17), (32, 32)):
        batch = others(n, seed=n + pos)
        batch.insert(pos, target)
        toks, audio = result(engine.run_batch(batch)[pos])
        assert toks == alone[0], (n, pos)
        assert torch.equal(audio, alone[1]), (n, pos)


def test_seedless_requests_differ_and_reported_seed_reproduces(make_engine):
    engine = make_engine()
    p = prompts(1, seed=9)[0]
    unseeded = {"main": {"temperature": 1.0, "max_tokens": 16}}
    runs = engine.run_batch([{"inputs": {"prompt_ids": p}, "sampling": unseeded} for _ in range(4)])
    seeds = [r.seeds["lm"] for r in runs]
    assert len(set(seeds)) == 4
    assert len({tuple(r.cat("token").tolist()) for r in runs}) > 1
    for r in runs:
        again = engine.run_batch([{"inputs": {"prompt_ids": p}, "sampling": {"main": {**unseeded["main"], "seed": r.seeds["lm"]}}}])[0]
        assert again.cat("token").tolist() == r.cat("token").tolist()
        assert torch.equal(again.cat("audio"), r.cat("audio"))


def test_aux_label_takes_effect_and_unknown_label_is_rejected(make_engine):
    import pytest
    from mstar.sampling import UnknownSamplerLabelError

    engine = make_engine()
    p = prompts(1, seed=9)[0]
    greedy_main = {"temperature": 0, "max_tokens": 16}
    codes = []
    for aux in ({"temperature": 0}, {"temperature": 1.0, "seed": 1}, {"temperature": 1.0, "seed": 2}):
        r = engine.run_batch([{"inputs": {"prompt_ids": p}, "sampling": {"main": greedy_main, "aux": {"residual": aux}}}])[0]
        codes.append((r.cat("token").tolist(), r.cat("audio")))
    assert codes[0][0] == codes[1][0] == codes[2][0]  # main greedy: same tokens
    assert not torch.allclose(codes[1][1], codes[2][1])  # aux sampled with different seeds: different audio
    with pytest.raises(UnknownSamplerLabelError, match="resid"):
        engine.add_request({"prompt_ids": p}, {"main": greedy_main, "aux": {"resid": {}}})
