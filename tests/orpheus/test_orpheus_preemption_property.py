"""Preemption under pressure never changes Orpheus's tokens or logits (see the toy's
property test in tests/core/engine/test_preemption_property.py for the rationale)."""

from __future__ import annotations

import random

import pytest
import torch
from mstar.kv import KVCacheManager
from orpheus_reference import official_prompt

STEPS = 8
GREEDY = {"temperature": 0, "repetition_penalty": 1.0, "top_p": 1.0, "max_tokens": STEPS}
WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while", "seven", "tired", "owls", "sing", "quietly"]


def _request(prompt: list[int]) -> dict:
    return {"inputs": {"prompt_ids": torch.tensor(prompt)}, "sampling": GREEDY, "kwargs": {"return_logits": True}}


def _outputs(result) -> tuple[list[int], torch.Tensor]:
    assert result.error is None, result.error
    return result.cat("token").tolist(), torch.stack(result.signals["logits"])


@pytest.mark.parametrize("trial", range(3))
def test_preempted_requests_equal_requests_run_alone(trial, quiet_ckpt, engines):
    from mstar import Engine

    rng = random.Random(2000 + trial)
    prompts = [
        official_prompt(quiet_ckpt, " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 40))), "tara")
        for _ in range(rng.randint(4, 6))
    ]
    calm = engines(quiet_ckpt)
    kv = calm.core.nodes["lm"].kv
    per_position = KVCacheManager.bytes_per_block(kv.num_layers, kv.num_kv_heads, kv.head_dim, 1, kv.dtype)
    block_size = rng.choice([1, 4, 8])
    blocks = -(-(max(len(p) for p in prompts) + STEPS) // block_size) + rng.randint(1, 4)
    engine = Engine.from_model(
        "orpheus", weights=quiet_ckpt, block_size=block_size, kv_budget_bytes=per_position * block_size * blocks,
        max_num_batched_tokens=rng.randint(6, 32),
    )
    try:
        order = list(range(len(prompts)))
        rng.shuffle(order)
        results = engine.run_batch([_request(prompts[i]) for i in order])
        assert engine.core.stats.preemptions > 0
        for i, result in zip(order, results, strict=True):
            tokens, logits = _outputs(result)
            alone_tokens, alone_logits = _outputs(calm.run_batch([_request(prompts[i])])[0])
            assert tokens == alone_tokens
            torch.testing.assert_close(logits, alone_logits, rtol=0, atol=1e-4)
        pool = engine.core.nodes["lm"].kv
        assert pool.num_free_blocks == pool.num_blocks
    finally:
        engine.close()
