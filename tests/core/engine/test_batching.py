"""Batched, chunked and preempted runs give the same greedy outputs as a dense reference."""

from __future__ import annotations

import pytest
from toy_reference import GREEDY, dense_greedy, prompts


def run_all(engine, ps, sampling=GREEDY):
    res = engine.run_batch([{"inputs": {"prompt_ids": p}, "sampling": sampling} for p in ps])
    for r in res:
        assert r.error is None, r.error
    return [(r.cat("token").tolist(), r.cat("codes").tolist() if "codes" in r.signals else None) for r in res]


def tokens(engine, ps):
    res = engine.run_batch([{"inputs": {"prompt_ids": p}, "sampling": GREEDY} for p in ps])
    assert all(r.error is None for r in res), [r.error for r in res]
    return [r.cat("token").tolist() for r in res]


@pytest.fixture(scope="module")
def reference(toy_ckpt):
    return [dense_greedy(toy_ckpt, p, 12)[0] for p in prompts(16)]


def test_sixteen_requests_batched_equal_alone_and_dense_reference(make_engine, reference):
    engine = make_engine()
    ps = prompts(16)
    batched = tokens(engine, ps)
    alone = [tokens(engine, [p])[0] for p in ps]
    assert batched == alone
    assert batched == reference
    assert all(len(t) > 0 for t in batched)


def test_batch_actually_batches(make_engine):
    engine = make_engine()
    node = engine.core.nodes["lm"]
    sizes: list[int] = []
    run = node.executor.run

    def spy(walk, rows):
        sizes.append(len(rows))
        return run(walk, rows)

    node.executor.run = spy
    assert [len(t) for t in tokens(engine, prompts(16))] == [12] * 16
    # Submitted together with nothing decoding, all 16 prefill in the first forward (the
    # toy's cap of 4 prefill rows per step applies only beside decode rows): 12 forwards.
    assert sizes == [16] * 12
    assert engine.core.stats.forwards_by_group["lm:mixed"] == 12


def test_prefill_cap_holds_beside_decodes(make_engine):
    """Requests arriving while one decodes prefill at most 4 per forward (the toy's cap)."""
    from mstar.engine.request import Request

    engine = make_engine()
    core = engine.core
    node = core.nodes["lm"]
    walks: list[list[str]] = []
    run = node.executor.run

    def spy(walk, rows):
        walks.append([r.walk for r in rows])
        return run(walk, rows)

    node.executor.run = spy
    ps = prompts(11)
    add = lambda i: core.add_request(Request(f"r{i}", {"prompt_ids": ps[i]}, {}, engine.make_sampling(GREEDY), 0))  # noqa: E731
    add(0)
    core.step()
    for i in range(1, 11):
        add(i)
    while core.has_work():
        core.step()
    lm_forwards = [w for w in walks if w]
    assert [w.count("prefill") for w in lm_forwards[:5]] == [1, 4, 4, 2, 0]
    assert [w.count("decode") for w in lm_forwards[:5]] == [0, 1, 5, 9, 11]


def test_chunked_prefill_equals_unchunked(make_engine, reference):
    chunked = make_engine(max_num_batched_tokens=7)
    unchunked = make_engine(chunked_prefill=False)
    ps = prompts(16)
    assert tokens(chunked, ps) == tokens(unchunked, ps) == reference


def test_preemption_gives_same_outputs(make_engine, reference):
    # 2 layers x 2 kv heads x 16 dims x 4 bytes x 2 (K,V) = 512 B per position; 20 blocks of 4
    # hold the longest request (< 60 positions) but not 16 at once.
    engine = make_engine(kv_budget_bytes=512 * 4 * 20, block_size=4)
    assert engine.core.nodes["lm"].kv.num_blocks == 20
    ps = prompts(16)
    assert tokens(engine, ps) == reference
    assert engine.core.stats.preemptions > 0
    kv = engine.core.nodes["lm"].kv
    assert kv.num_free_blocks == kv.num_blocks
