"""The Thinker with prefix caching: text prompts that share a system prompt reuse its
blocks and answer exactly as without the cache (tokens; logits within float rounding); a
prompt with media, or one for a spoken answer (the Talker reads every prompt position's
states), is never shared."""

from __future__ import annotations

import torch
from thinker_reference import make_cases

GREEDY = {"thinker": {"temperature": 0, "max_tokens": 6, "ignore_eos": True}}
SPEECH_SAMPLING = {
    "thinker": {"temperature": 0, "max_tokens": 4, "ignore_eos": True},
    "talker": {"main": {"temperature": 0, "max_tokens": 8, "min_tokens": 8}, "aux": {"code_predictor": {"temperature": 0}}},
}


def _text_request(ids: list[int]) -> dict:
    return {"inputs": {"prompt_ids": torch.tensor(ids)}, "sampling": GREEDY, "kwargs": {"return_logits": True}}


def test_text_prompts_share_their_prefix_and_answer_as_without(omni_ckpt, omni_engines):
    cached = omni_engines(omni_ckpt, prefix_caching=True, block_size=4)
    plain = omni_engines(omni_ckpt)
    g = torch.Generator().manual_seed(7)
    system = torch.randint(10, 1000, (37,), generator=g).tolist()
    prompts = [system + torch.randint(10, 1000, (n,), generator=g).tolist() for n in (5, 9, 5)]
    before = cached.core.stats.prefix_hit_tokens
    results = [cached.run_batch([_text_request(p)])[0] for p in prompts]
    # The second and third find the system prompt's 9 whole blocks (36 positions), at least.
    assert cached.core.stats.prefix_hit_tokens - before >= 2 * 36
    for prompt, result in zip(prompts, results, strict=True):
        ref = plain.run_batch([_text_request(prompt)])[0]
        assert result.error is None and ref.error is None
        assert result.cat("tokens").tolist() == ref.cat("tokens").tolist()
        torch.testing.assert_close(torch.stack(result.signals["logits"]), torch.stack(ref.signals["logits"]), rtol=0, atol=1e-5)
    kv = cached.core.nodes["thinker"].kv
    assert kv.num_used_blocks == 0


def test_prompts_with_media_are_not_shared(omni_ckpt, omni_engines):
    cached = omni_engines(omni_ckpt, prefix_caching=True, block_size=4)
    case = next(c for c in make_cases(omni_ckpt).values() if c.engine_inputs)
    request = {"inputs": {"prompt_ids": torch.tensor(case.prompt), **case.engine_inputs}, "sampling": GREEDY}
    before = cached.core.stats.prefix_hit_tokens
    for _ in range(2):
        assert cached.run_batch([request])[0].error is None
    assert cached.core.stats.prefix_hit_tokens == before


def test_a_spoken_answer_computes_its_whole_prompt(omni_ckpt, omni_engines):
    cached = omni_engines(omni_ckpt, prefix_caching=True, block_size=4)
    plain = omni_engines(omni_ckpt)
    prompt = torch.tensor(make_cases(omni_ckpt)["text"].prompt)
    request = {"inputs": {"prompt_ids": prompt}, "sampling": SPEECH_SAMPLING, "kwargs": {"modalities": ["text", "audio"]}}
    before = cached.core.stats.prefix_hit_tokens
    outs = [cached.run_batch([request])[0] for _ in range(2)]
    ref = plain.run_batch([request])[0]
    assert cached.core.stats.prefix_hit_tokens == before
    for out in outs:
        assert out.error is None, out.error
        assert torch.equal(torch.cat(out.signals["codes"]), torch.cat(ref.signals["codes"]))
