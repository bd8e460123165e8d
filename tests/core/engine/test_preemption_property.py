"""Preemption under pressure never changes a request's output (a property, not one case).

Random token budgets, block sizes, KV budgets and arrival orders, with long prompts so that
requests are preempted in the middle of a chunked prefill and again while they recompute:
every request's tokens and per-step log-probabilities equal the same request run alone on
an engine without pressure.
"""

from __future__ import annotations

import random

import pytest
import torch
from mstar_toy.config import encode_text

# 2 layers x 2 KV heads x 16 dims x 4 bytes x (K, V)
TOY_BYTES_PER_POSITION = 512
MAX_TOKENS = 10
SAMPLING = {
    "main": {"temperature": 0, "max_tokens": MAX_TOKENS, "ignore_eos": True, "logprobs": True, "top_logprobs": 5},
    "aux": {"residual": {"temperature": 0}},
}


def _prompts(rng: random.Random, n: int) -> list[torch.Tensor]:
    out = []
    for i in range(n):
        length = rng.randint(20, 140)
        text = "".join(chr(97 + rng.randrange(26)) for _ in range(length))
        out.append(torch.tensor(encode_text(f"{i}:{text}", 256)))
    return out


def _outputs(result) -> tuple[list[int], torch.Tensor, torch.Tensor]:
    assert result.error is None, result.error
    return result.cat("token").tolist(), result.cat("logprob"), result.cat("top_logprob_values")


@pytest.fixture(scope="module")
def calm_engine(toy_ckpt):
    from mstar import Engine

    engine = Engine.from_model("toy", weights=toy_ckpt)
    yield engine
    engine.close()


@pytest.mark.parametrize("trial", range(6))
def test_preempted_requests_equal_requests_run_alone(trial, toy_ckpt, calm_engine, make_engine):
    rng = random.Random(1000 + trial)
    ps = _prompts(rng, rng.randint(5, 9))
    block_size = rng.choice([1, 2, 4, 8])
    longest = max(len(p) for p in ps) + MAX_TOKENS
    # Room for the longest request plus a little: far less than all of them together.
    blocks = -(-longest // block_size) + rng.randint(1, 6)
    engine = make_engine(
        kv_budget_bytes=TOY_BYTES_PER_POSITION * block_size * blocks,
        block_size=block_size,
        max_num_batched_tokens=rng.randint(5, 40),
    )
    order = list(range(len(ps)))
    rng.shuffle(order)
    results = engine.run_batch([{"inputs": {"prompt_ids": ps[i]}, "sampling": SAMPLING} for i in order])
    assert engine.core.stats.preemptions > 0
    for i, result in zip(order, results, strict=True):
        tokens, logprob, top = _outputs(result)
        alone_tokens, alone_logprob, alone_top = _outputs(
            calm_engine.run_batch([{"inputs": {"prompt_ids": ps[i]}, "sampling": SAMPLING}])[0]
        )
        assert tokens == alone_tokens, f"request {i} diverged under preemption"
        assert len(tokens) == MAX_TOKENS
        torch.testing.assert_close(logprob, alone_logprob, rtol=0, atol=1e-5)
        torch.testing.assert_close(top, alone_top, rtol=0, atol=1e-5)
    kv = engine.core.nodes["lm"].kv
    assert kv.num_free_blocks == kv.num_blocks
