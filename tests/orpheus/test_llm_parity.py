"""The backbone against ``transformers.LlamaForCausalLM`` on the same checkpoint files."""

from __future__ import annotations

import pytest
import torch
from orpheus_reference import hf_greedy, hf_logits, hf_model, official_prompt

TEXTS = [("tara", "Hi."), ("leo", "A somewhat longer sentence, to make the batch ragged."), ("mia", "Two words"),
         ("zoe", "Numbers 1, 2 and 3; punctuation!?")]
STEPS = 33  # the prefill's token and 32 decode steps
LOGITS_TOL = 1e-4


def _run(engine, prompts: list[list[int]], max_tokens: int = STEPS) -> list:
    greedy = {"temperature": 0, "repetition_penalty": 1.0, "top_p": 1.0, "max_tokens": max_tokens}
    requests = [{"inputs": {"prompt_ids": torch.tensor(p)}, "sampling": greedy, "kwargs": {"return_logits": True}} for p in prompts]
    results = engine.run_batch(requests)
    assert all(r.error is None for r in results), [r.error for r in results]
    return results


@pytest.mark.parametrize("budget", [2048, 8], ids=["whole-prefill", "chunked-prefill"])
def test_ragged_batch_logits_and_greedy_tokens_match_transformers(quiet_ckpt, engines, budget):
    engine = engines(quiet_ckpt, max_num_batched_tokens=budget)
    prompts = [official_prompt(quiet_ckpt, text, voice) for voice, text in TEXTS]
    assert len({len(p) for p in prompts}) == len(prompts)  # ragged
    worst = 0.0
    for prompt, result in zip(prompts, _run(engine, prompts), strict=True):
        tokens = result.cat("token").tolist()
        assert len(tokens) == STEPS and result.finish_reason == "length"
        ours = torch.stack(result.signals["logits"])
        ref = hf_logits(quiet_ckpt, prompt, tokens)
        assert ours.shape == ref.shape == (STEPS, hf_model(quiet_ckpt).config.vocab_size)
        worst = max(worst, float((ours - ref).abs().max()))
        assert tokens == hf_greedy(quiet_ckpt, prompt, STEPS)
    print(f"max |logits - transformers| over prefill + 32 decode steps: {worst:.2e}")
    assert worst < LOGITS_TOL


def test_tied_embeddings_match_transformers(tied_ckpt, engines):
    model = hf_model(tied_ckpt)
    assert model.config.tie_word_embeddings
    prompt = official_prompt(tied_ckpt, "tied head", "dan")
    result = _run(engines(tied_ckpt), [prompt], max_tokens=8)[0]
    tokens = result.cat("token").tolist()
    assert tokens == hf_greedy(tied_ckpt, prompt, 8)
    diff = (torch.stack(result.signals["logits"]) - hf_logits(tied_ckpt, prompt, tokens)).abs().max()
    assert float(diff) < LOGITS_TOL


def test_llama3_rope_scaling_matches_transformers():
    from mstar.layers.rope import RotaryEmbedding
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    # The released Orpheus-3B (Llama-3.2-3B) values.
    scaling = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}
    cfg = LlamaConfig(hidden_size=3072, num_attention_heads=24, head_dim=128, max_position_embeddings=131072,
                      rope_theta=500000.0, rope_scaling=scaling)
    ref, _ = ROPE_INIT_FUNCTIONS["llama3"](cfg, "cpu")
    ours = RotaryEmbedding(128, {"rope_theta": 500000.0, **scaling}).inv_freq
    torch.testing.assert_close(ours, ref, rtol=0, atol=0)
