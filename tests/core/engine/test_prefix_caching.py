"""Prefix caching (``EngineConfig(prefix_caching=True)``) on the toy: a request's output is
the same with and without cache hits, under random shared prefixes, arrivals, preemptions
and evictions; shared blocks are never freed while held; all memory comes back."""

from __future__ import annotations

import random

import pytest
import torch
from mstar_toy.config import encode_text

# 2 layers x 2 KV heads x 16 dims x 4 bytes x (K, V)
TOY_BYTES_PER_POSITION = 512
MAX_TOKENS = 8
SAMPLING = {
    "main": {"temperature": 0, "max_tokens": MAX_TOKENS, "ignore_eos": True, "logprobs": True, "top_logprobs": 5},
    "aux": {"residual": {"temperature": 0}},
}


def _text(rng: random.Random, n: int) -> str:
    return "".join(chr(97 + rng.randrange(26)) for _ in range(n))


def _request(prompt: torch.Tensor) -> dict:
    return {"inputs": {"prompt_ids": prompt}, "sampling": SAMPLING}


def _outputs(result) -> tuple[list[int], torch.Tensor, torch.Tensor]:
    assert result.error is None, result.error
    return result.cat("token").tolist(), result.cat("logprob"), result.cat("top_logprob_values")


@pytest.fixture(scope="module")
def cold_engine(toy_ckpt):
    from mstar import Engine

    engine = Engine.from_model("toy", weights=toy_ckpt, prefix_caching=False)  # cold: caching is on by default
    yield engine
    engine.close()


def _assert_same_as_cold(cold_engine, prompt: torch.Tensor, result, what: str) -> None:
    tokens, logprob, top = _outputs(result)
    cold_tokens, cold_logprob, cold_top = _outputs(cold_engine.run_batch([_request(prompt)])[0])
    assert tokens == cold_tokens, f"{what}: tokens differ from a cold run"
    torch.testing.assert_close(logprob, cold_logprob, rtol=0, atol=1e-5)
    torch.testing.assert_close(top, cold_top, rtol=0, atol=1e-5)


def test_a_repeated_prompt_is_served_from_the_cache(make_engine, cold_engine) -> None:
    engine = make_engine(prefix_caching=True, block_size=4)
    prompt = torch.tensor(encode_text("a system prompt that every request shares, then: hello", 256))
    first = engine.run_batch([_request(prompt)])[0]
    assert engine.core.stats.prefix_hit_tokens == 0
    second = engine.run_batch([_request(prompt)])[0]
    # Whole blocks, and the last position always computed: (len - 1) // 4 * 4 positions.
    assert engine.core.stats.prefix_hit_tokens == (len(prompt) - 1) // 4 * 4
    for result in (first, second):
        _assert_same_as_cold(cold_engine, prompt, result, "repeat")
    kv = engine.core.nodes["lm"].kv
    assert kv.num_free_blocks == kv.num_blocks and kv.num_cached_blocks > 0


def test_a_multi_turn_conversation_computes_only_the_new_turn(make_engine) -> None:
    """Each turn's prompt is the last prompt, its answer and a new message: the cache holds
    the last turn's prompt and its generated tokens, so what is computed stays about the
    new message's length, not the history's."""
    engine = make_engine(prefix_caching=True, block_size=4)
    history: list[int] = encode_text("system: be brief.", 256)
    computed = []
    for turn in range(6):
        history += encode_text(f" user {turn}: tell me about {chr(97 + turn) * 5}.", 256)
        before = engine.core.stats.prefix_hit_tokens
        result = engine.run_batch([_request(torch.tensor(history))])[0]
        computed.append(len(history) - (engine.core.stats.prefix_hit_tokens - before))
        history += result.cat("token").tolist()
    # The new message is 30 positions; the history grows past 250. Block rounding and the
    # answer's last (never fed) token leave at most block_size + 1 more to compute.
    assert all(c <= 30 + 4 + 1 for c in computed[1:]), computed
    assert len(history) > 200


@pytest.mark.parametrize("trial", range(5))
def test_outputs_equal_a_cold_cache_under_sharing_preemption_and_eviction(trial, make_engine, cold_engine) -> None:
    rng = random.Random(2000 + trial)
    prefixes = [_text(rng, rng.randint(5, 60)) for _ in range(3)]
    prompts = [torch.tensor(encode_text(rng.choice(prefixes) + _text(rng, rng.randint(1, 30)), 256)) for _ in range(12)]
    block_size = rng.choice([1, 2, 4, 8])
    longest = max(len(p) for p in prompts) + MAX_TOKENS
    blocks = -(-longest // block_size) * 2 + rng.randint(1, 6)  # room for two: far less than all
    engine = make_engine(
        prefix_caching=True,
        kv_budget_bytes=TOY_BYTES_PER_POSITION * block_size * blocks,
        block_size=block_size,
        max_num_batched_tokens=rng.randint(8, 64),
    )
    kv = engine.core.nodes["lm"].kv
    cache = kv.prefix_cache
    assert cache is not None
    held_checks = 0
    original_release = cache.release

    def release_checking(blocks_: list[int]) -> None:
        # A block in some other live stream's table must never become free or evictable.
        nonlocal held_checks
        before = {b: cache.references(b) for b in blocks_}
        original_release(blocks_)
        live = {b for rid in kv.requests() for s in kv.streams(rid) for b in kv.block_table(rid, s)}
        for b in blocks_:
            if b in live:
                held_checks += 1
                assert cache.references(b) == before[b] - 1 > 0, f"block {b} released while held"

    cache.release = release_checking  # type: ignore[method-assign]
    results = []
    for wave in (prompts[:4], prompts[4:]):  # the second wave finds the first's blocks cached
        order = list(range(len(wave)))
        rng.shuffle(order)
        out = engine.run_batch([_request(wave[i]) for i in order])
        results += [(wave[i], r) for i, r in zip(order, out, strict=True)]
    assert engine.core.stats.prefix_hit_tokens > 0
    assert engine.core.stats.preemptions > 0 or cache.evictions > 0
    for i, (prompt, result) in enumerate(results):
        _assert_same_as_cold(cold_engine, prompt, result, f"request {i}")
        assert len(result.cat("token")) == MAX_TOKENS
    assert kv.num_free_blocks == kv.num_blocks, "blocks leaked"
    assert kv.num_used_blocks == 0


def test_prompts_with_nothing_shared_get_no_hits(make_engine) -> None:
    engine = make_engine(prefix_caching=True, block_size=4)
    engine.run_batch([_request(torch.tensor(encode_text(f"{i} unrelated prompt {i * 7}", 256))) for i in range(4)])
    assert engine.core.stats.prefix_hit_tokens == 0



def test_a_cache_recomputed_after_preemption_is_offered_for_sharing_again(make_engine, cold_engine) -> None:
    """A request preempted mid-run recomputes its cache from its history; the recomputed
    blocks enter the prefix index as if it had never been preempted, so its prompt sent
    again maps them. The pool (12 blocks of 4) fits one request at a time: the older a
    (24 + 24 positions) preempts the younger x (40 + 8) as it decodes and evicts every
    block x had cached; x then recomputes and in turn evicts all of a's, so the last hit
    can only come from x's recomputed blocks."""
    engine = make_engine(prefix_caching=True, block_size=4, kv_budget_bytes=TOY_BYTES_PER_POSITION * 4 * 12,
                         max_num_batched_tokens=8)
    kv = engine.core.nodes["lm"].kv
    a = torch.tensor(encode_text("the older one: twenty-four", 256)[:24])
    x = torch.tensor(encode_text("the younger request, forty positions long", 256)[:40])
    assert (len(a), len(x)) == (24, 40)
    longer = {**SAMPLING, "main": {**SAMPLING["main"], "max_tokens": 24}}
    first = engine.run_batch([{"inputs": {"prompt_ids": a}, "sampling": longer}, _request(x)])
    assert engine.core.stats.preemptions > 0 and kv.prefix_cache.evictions > 0
    assert len(first[0].cat("token")) == 24
    _assert_same_as_cold(cold_engine, x, first[1], "x, recomputed after preemption")
    hits = engine.core.stats.prefix_hit_tokens
    again = engine.run_batch([_request(x)])[0]
    # Every whole block of x's prompt but the one holding its last position (always computed).
    assert engine.core.stats.prefix_hit_tokens - hits == (len(x) - 1) // 4 * 4
    _assert_same_as_cold(cold_engine, x, again, "x, mapped from its recomputed blocks")
    assert kv.num_free_blocks == kv.num_blocks
