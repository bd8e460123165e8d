"""Every KV block returns to the pool; a failing request fails alone; bad prompts error."""

from __future__ import annotations

import time

import pytest
import torch
from toy_reference import GREEDY, prompts


def kv_full(engine) -> bool:
    kv = engine.core.nodes["lm"].kv
    return kv.num_free_blocks == kv.num_blocks


def wait_idle(engine, timeout=10.0) -> None:
    deadline = time.monotonic() + timeout
    while engine.core.has_work() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not engine.core.has_work()


def test_blocks_return_after_completion(make_engine):
    engine = make_engine()
    engine.run_batch([{"inputs": {"prompt_ids": p}, "sampling": GREEDY} for p in prompts(6)])
    wait_idle(engine)
    assert kv_full(engine)
    for node in engine.core.nodes.values():
        if node.sampler is not None:
            assert all(not s.active_slots for s in node.sampler.samplers.values())


def test_abort_mid_decode_frees_blocks(make_engine):
    engine = make_engine()
    sampling = {"main": {"temperature": 0, "max_tokens": 400, "ignore_eos": True}}
    gen = engine.generate({"prompt_ids": prompts(1)[0]}, sampling, request_id="victim")
    seen = 0
    for out in gen:
        if out.signal == "token":
            seen += 1
            if seen == 5:
                assert not kv_full(engine)
                engine.abort("victim")
        if out.finished:
            assert out.finish_reason == "abort"
            break
    wait_idle(engine)
    assert kv_full(engine)


@pytest.mark.parametrize("when", ["before_sampling", "after_sampling"])
def test_failing_request_fails_alone(make_engine, when):
    engine = make_engine()
    lm = engine.core.nodes["lm"].submodule
    original = lm.forward_batched

    def flaky(graph_walk, engine_inputs, **kw):
        if when == "after_sampling":  # the batch already drew its tokens: they must be undone
            out = original(graph_walk, engine_inputs, **kw)
        if "bad" in engine_inputs.request_ids:
            raise RuntimeError("boom in forward")
        return out if when == "after_sampling" else original(graph_walk, engine_inputs, **kw)

    lm.forward_batched = flaky
    ps = prompts(5)
    seeded = {"main": {"temperature": 1.0, "max_tokens": 12, "seed": 99}, "aux": {"residual": {"temperature": 1.0}}}
    reqs = [{"inputs": {"prompt_ids": p}, "sampling": seeded, "request_id": f"r{i}"} for i, p in enumerate(ps)]
    reqs.insert(2, {"inputs": {"prompt_ids": ps[0]}, "sampling": seeded, "request_id": "bad"})
    res = {r.request_id: r for r in engine.run_batch(reqs)}
    assert "boom in forward" in res["bad"].error
    lm.forward_batched = original
    alone = [engine.run_batch([{"inputs": {"prompt_ids": p}, "sampling": seeded}])[0] for p in ps]
    for i in range(5):
        assert res[f"r{i}"].error is None
        assert res[f"r{i}"].cat("token").tolist() == alone[i].cat("token").tolist()
    wait_idle(engine)
    assert kv_full(engine)


def test_prompt_longer_than_max_model_len_is_a_clear_error(make_engine):
    engine = make_engine()
    too_long = torch.full((600,), 97)
    (res,) = engine.run_batch([{"inputs": {"prompt_ids": too_long}, "sampling": GREEDY}])
    assert res.error is not None and "maximum length of 512" in res.error
    (ok,) = engine.run_batch([{"inputs": {"prompt_ids": prompts(1)[0]}, "sampling": GREEDY}])
    assert ok.error is None
    wait_idle(engine)
    assert kv_full(engine)


def test_generation_stops_at_max_model_len(make_engine):
    engine = make_engine()
    prompt = torch.full((500,), 97)
    (res,) = engine.run_batch([{"inputs": {"prompt_ids": prompt}, "sampling": {"temperature": 0, "max_tokens": 100, "ignore_eos": True}}])
    assert res.error is None
    assert res.finish_reason == "length"
    assert len(res.cat("token")) == 512 - 500 + 1  # the last sampled token needs no cache slot


def test_empty_prompt_and_bad_ids_fail_alone(make_engine):
    engine = make_engine()
    res = engine.run_batch([
        {"inputs": {"prompt_ids": torch.tensor([], dtype=torch.long)}, "sampling": GREEDY},
        {"inputs": {"prompt_ids": torch.tensor([5, 9999])}, "sampling": GREEDY},
        {"inputs": {"prompt_ids": prompts(1)[0]}, "sampling": GREEDY},
    ])
    assert "empty" in res[0].error
    assert "token ids must" in res[1].error and "259" in res[1].error
    assert res[2].error is None and len(res[2].cat("token")) > 0


def test_errors_carry_a_type_and_stats_snapshot(make_engine):
    engine = make_engine(kv_budget_bytes=512 * 16 * 4, block_size=16)  # 64 positions
    res = engine.run_batch([
        {"inputs": {"prompt_ids": torch.tensor([], dtype=torch.long)}, "sampling": GREEDY},
        {"inputs": {"prompt_ids": torch.full((100,), 97)}, "sampling": GREEDY},
    ])
    assert res[0].error_type == "invalid_request"
    assert res[1].error_type == "too_large" and "KV pool holds 64" in res[1].error
    stats = engine.stats()
    # Prefix caching is on by default: the too-large prompt was looked up (100 positions)
    # but never computed, so nothing entered the index.
    assert stats["kv"]["lm"] == {"used_blocks": 0, "total_blocks": 4, "block_bytes": 512 * 16, "cached_blocks": 0,
                                 "prefix_queried_tokens": 100, "prefix_hit_tokens": 0, "prefix_evictions": 0}
    assert stats["running"] == 0 and stats["waiting"] == 0
