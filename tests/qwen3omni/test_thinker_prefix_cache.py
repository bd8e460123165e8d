"""The Thinker with prefix caching: prompts that share a prefix reuse its blocks and answer
as without the cache (an engine with prefix_caching=False, as caching is on by default;
tokens equal; logits within 1e-5); media rows are identified by
their content, so other media part the prompts there; a repeated media item is encoded
once (the encoders' output cache); a spoken answer's prompt (the Talker reads every prompt
position's states) is never shared."""

from __future__ import annotations

import pytest
import torch
from thinker_reference import IMAGE, make_cases

GREEDY = {"thinker": {"temperature": 0, "max_tokens": 6, "ignore_eos": True}}
SPEECH_SAMPLING = {
    "thinker": {"temperature": 0, "max_tokens": 4, "ignore_eos": True},
    "talker": {"main": {"temperature": 0, "max_tokens": 8, "min_tokens": 8}, "aux": {"code_predictor": {"temperature": 0}}},
}


def _text_request(ids: list[int]) -> dict:
    return {"inputs": {"prompt_ids": torch.tensor(ids)}, "sampling": GREEDY, "kwargs": {"return_logits": True}}


def test_text_prompts_share_their_prefix_and_answer_as_without(omni_ckpt, omni_engines):
    cached = omni_engines(omni_ckpt, prefix_caching=True, block_size=4)
    plain = omni_engines(omni_ckpt, prefix_caching=False)
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


def _raw_request(case, pixel_shift: float = 0.0) -> dict:
    """The processor's media tensors through the encoder nodes (``pixel_shift``: other pixels)."""
    media = {k: v for k, v in case.hf_inputs.items() if isinstance(v, torch.Tensor)}
    if pixel_shift:
        media = {k: v + pixel_shift if k.startswith("pixel_values") else v for k, v in media.items()}
    kinds = [kind for kind, key in (("audio", "input_features"), ("image", "pixel_values"), ("video", "pixel_values_videos"))
             if key in media]
    return {"inputs": {"prompt_ids": torch.tensor(case.prompt), **media}, "sampling": GREEDY,
            "kwargs": {"return_logits": True, "media": kinds}}


def _assert_same(result, ref) -> None:
    assert result.error is None and ref.error is None, (result.error, ref.error)
    assert result.cat("tokens").tolist() == ref.cat("tokens").tolist()
    torch.testing.assert_close(torch.stack(result.signals["logits"]), torch.stack(ref.signals["logits"]), rtol=0, atol=1e-5)


def _cache_hits(engine) -> int:
    return sum(n.output_cache.hits for n in engine.core.nodes.values() if n.output_cache is not None)


@pytest.mark.parametrize("name", ["image", "audio", "video_with_audio"])
def test_the_same_media_is_encoded_once_and_its_prompt_shared(omni_ckpt, omni_engines, name):
    """A repeated request with media: its encoders' outputs come from the output cache (no
    forward) and its whole prompt but the last position from the prefix cache; the answer
    equals the same request on an engine without caches."""
    cached = omni_engines(omni_ckpt, prefix_caching=True, block_size=4)
    plain = omni_engines(omni_ckpt, prefix_caching=False)
    case = make_cases(omni_ckpt)[name]
    request = _raw_request(case)
    kinds = len(request["kwargs"]["media"])
    first = cached.run_batch([request])[0]
    hits, encoded = cached.core.stats.prefix_hit_tokens, _cache_hits(cached)
    second = cached.run_batch([request])[0]
    assert cached.core.stats.prefix_hit_tokens - hits == (len(case.prompt) - 1) // 4 * 4
    assert _cache_hits(cached) - encoded == kinds
    ref = plain.run_batch([request])[0]
    _assert_same(first, ref)
    _assert_same(second, ref)
    assert cached.core.nodes["thinker"].kv.num_used_blocks == 0


def test_the_same_tokens_with_other_media_share_only_what_precedes_it(omni_ckpt, omni_engines):
    cached = omni_engines(omni_ckpt, prefix_caching=True, block_size=4)
    plain = omni_engines(omni_ckpt, prefix_caching=False)
    case = make_cases(omni_ckpt)["two_images"]
    cached.run_batch([_raw_request(case)])
    other = _raw_request(case, pixel_shift=0.25)  # same prompt ids, other pixels
    hits, encoded = cached.core.stats.prefix_hit_tokens, _cache_hits(cached)
    result = cached.run_batch([other])[0]
    first_media = next(i for i, t in enumerate(case.prompt) if t == IMAGE)
    assert 0 < cached.core.stats.prefix_hit_tokens - hits <= first_media
    assert _cache_hits(cached) == encoded
    _assert_same(result, plain.run_batch([other])[0])


def test_encoder_outputs_given_as_inputs_are_identified_by_content(omni_ckpt, omni_engines):
    """Media embeddings given directly (no encoder walk) are shared by content too: equal
    embeddings share the prompt, other embeddings part at the first media row."""
    cached = omni_engines(omni_ckpt, prefix_caching=True, block_size=4)
    plain = omni_engines(omni_ckpt, prefix_caching=False)
    case = make_cases(omni_ckpt)["image"]
    same = {"inputs": {"prompt_ids": torch.tensor(case.prompt), **case.engine_inputs}, "sampling": GREEDY,
            "kwargs": {"return_logits": True}}
    changed = {**same, "inputs": {**same["inputs"], "image_embeds": case.engine_inputs["image_embeds"] * 1.5}}
    cached.run_batch([same])
    hits = cached.core.stats.prefix_hit_tokens
    second = cached.run_batch([same])[0]
    assert cached.core.stats.prefix_hit_tokens - hits == (len(case.prompt) - 1) // 4 * 4
    hits = cached.core.stats.prefix_hit_tokens
    third = cached.run_batch([changed])[0]
    assert cached.core.stats.prefix_hit_tokens - hits <= case.prompt.index(IMAGE)
    _assert_same(second, plain.run_batch([same])[0])
    _assert_same(third, plain.run_batch([changed])[0])


def test_a_spoken_answer_computes_its_whole_prompt(omni_ckpt, omni_engines):
    cached = omni_engines(omni_ckpt, prefix_caching=True, block_size=4)
    plain = omni_engines(omni_ckpt, prefix_caching=False)
    prompt = torch.tensor(make_cases(omni_ckpt)["text"].prompt)
    request = {"inputs": {"prompt_ids": prompt}, "sampling": SPEECH_SAMPLING, "kwargs": {"modalities": ["text", "audio"]}}
    before = cached.core.stats.prefix_hit_tokens
    outs = [cached.run_batch([request])[0] for _ in range(2)]
    ref = plain.run_batch([request])[0]
    assert cached.core.stats.prefix_hit_tokens == before
    for out in outs:
        assert out.error is None, out.error
        assert torch.equal(torch.cat(out.signals["codes"]), torch.cat(ref.signals["codes"]))
