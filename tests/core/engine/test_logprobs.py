"""Logprob signals of the toy LM (mstar.api.adapter's convention): the chosen token's raw
logprob and the top-N alternatives equal log_softmax of the LM's logits, recomputed here
densely, without the engine."""

from __future__ import annotations

import torch
from toy_reference import dense_logits, load_lm, prompts


def run(engine, prompt: torch.Tensor, **main) -> object:
    out = engine.run_batch([{"inputs": {"prompt_ids": prompt}, "sampling": {"main": {"max_tokens": 8, "ignore_eos": True, **main}}}])[0]
    assert out.error is None, out.error
    return out


def reference(lm, prompt: torch.Tensor, tokens: list[int]) -> list[torch.Tensor]:
    """log_softmax of the logits that chose each token, in float64."""
    ids, out = prompt.tolist(), []
    for tok in tokens:
        out.append(torch.log_softmax(dense_logits(lm, ids).double(), dim=-1))
        ids.append(tok)
    return out


def test_logprobs_equal_log_softmax_of_the_logits(make_engine, toy_ckpt):
    engine, lm = make_engine(), load_lm(toy_ckpt)
    prompt = prompts(1)[0]
    # Greedy, and sampled: raw logprobs do not depend on the temperature.
    for main in ({"temperature": 0}, {"temperature": 0.9, "seed": 5}):
        out = run(engine, prompt, logprobs=True, top_logprobs=5, **main)
        tokens = out.cat("token").tolist()
        chosen = out.cat("logprob")
        top_ids, top_values = torch.stack(out.signals["top_logprob_ids"]), torch.stack(out.signals["top_logprob_values"])
        assert len(tokens) == chosen.numel() == top_ids.shape[0] == 8 and top_ids.shape[1] == 5
        for k, ref in enumerate(reference(lm, prompt, tokens)):
            assert abs(float(chosen[k]) - float(ref[tokens[k]])) < 1e-4
            values, ids = ref.topk(5)
            assert top_ids[k].tolist() == ids.tolist()
            torch.testing.assert_close(top_values[k].double(), values, atol=1e-4, rtol=0)
        if main["temperature"] == 0:
            assert top_ids[:, 0].tolist() == tokens


def test_top_logprobs_width_and_no_logprobs_without_asking(make_engine):
    engine = make_engine()
    a, b = prompts(2, seed=3)
    wide, narrow, plain = engine.run_batch([
        {"inputs": {"prompt_ids": a}, "sampling": {"main": {"temperature": 0, "max_tokens": 4, "logprobs": True, "top_logprobs": 6}}},
        {"inputs": {"prompt_ids": b}, "sampling": {"main": {"temperature": 0, "max_tokens": 4, "logprobs": True, "top_logprobs": 2}}},
        {"inputs": {"prompt_ids": a}, "sampling": {"main": {"temperature": 0, "max_tokens": 4}}},
    ])
    # The sampler's width is the widest request's; a narrower one reads a prefix.
    assert all(t.shape == (6,) for t in wide.signals["top_logprob_ids"] + narrow.signals["top_logprob_ids"])
    alone = run(make_engine(), b, temperature=0, max_tokens=4, logprobs=True, top_logprobs=2)
    assert torch.equal(torch.stack(narrow.signals["top_logprob_ids"])[:, :2], torch.stack(alone.signals["top_logprob_ids"]))
    assert torch.equal(plain.cat("token"), wide.cat("token"))
    # Nobody in the batch asked: nothing extra is emitted.
    single = run(make_engine(), a, temperature=0, max_tokens=4)
    assert set(single.signals) == {"token", "audio"}


def test_a_withheld_stop_token_withholds_its_logprobs(make_engine):
    engine = make_engine()
    prompt = prompts(1, seed=7)[0]
    tokens = run(engine, prompt, temperature=0).cat("token").tolist()
    k = next(i for i in range(1, len(tokens)) if tokens[i] not in tokens[:i])
    out = run(engine, prompt, temperature=0, stop_token_ids=[tokens[k]], logprobs=True, top_logprobs=1)
    assert out.finish_reason == "stop" and out.cat("token").tolist() == tokens[:k]
    assert out.cat("logprob").numel() == k and len(out.signals["top_logprob_ids"]) == k
