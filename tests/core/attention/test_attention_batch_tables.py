"""``AttentionBatch.build`` reads block tables from the cache manager's persistent rows
(``mstar.kv.block_tables``), updated only where a stream changed. Over random joins, leaves,
preemptions (whole requests freed and re-grown), chunked prefills, decode runs and prefix
hits, every step's metadata equals what per-row tables rebuilt from scratch give."""

from __future__ import annotations

import random

import pytest
import torch
from mstar.attention import AttentionBatch
from mstar.kv import KVCacheManager


def _reference(rows: list[tuple[str, int]], kv: KVCacheManager) -> dict[str, list]:
    """The step's metadata from each stream's block list, one row at a time."""
    bs = kv.block_size
    lens = [kv.num_tokens(rid) for rid, _ in rows]
    tables = [kv.block_table(rid) for rid, _ in rows]
    positions = [p for (_, q), n in zip(rows, lens, strict=True) for p in range(n - q, n)]
    slots = [t[p // bs] * bs + p % bs for (_, q), n, t in zip(rows, lens, tables, strict=True) for p in range(n - q, n)]
    width = max(1, -(-max(lens) // bs))
    padded = [(t + [0] * width)[:width] for t in tables]
    indptr = [0]
    for _, q in rows:
        indptr.append(indptr[-1] + q)
    return {"qo_indptr": indptr, "kv_lens": lens, "block_tables": padded, "slot_mapping": slots, "positions": positions}


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("prefix_caching", [False, True])
def test_random_steps_equal_tables_rebuilt_per_row(seed: int, prefix_caching: bool) -> None:
    rng = random.Random(seed)
    kv = KVCacheManager(1, 1, 4, block_size=4, num_blocks=96, prefix_caching=prefix_caching)
    live: dict[str, list[int]] = {}  # request -> the token identities fed so far
    made = 0
    steps = 0
    for _ in range(300):
        action = rng.random()
        if action < 0.15 and len(live) < 12:
            made += 1
            rid = f"r{made}"
            shared = [7] * rng.choice([0, 4, 8, 13])  # a common prefix some requests share
            live[rid] = shared + [rng.randrange(100) for _ in range(rng.randrange(1, 20))]
            if prefix_caching:
                kv.map_prefix(rid, "main", live[rid], len(live[rid]) - 1)
            continue
        if action < 0.25 and live:
            rid = rng.choice(sorted(live))
            kv.free_request(rid)  # a leave, or a preemption (re-grown from zero below)
            if rng.random() < 0.5:
                del live[rid]
            continue
        rows = []
        for rid in rng.sample(sorted(live), k=min(len(live), rng.randrange(1, 9))):
            have = kv.num_tokens(rid)
            todo = len(live[rid]) - have
            q = min(todo, rng.randrange(1, 9)) if todo > 0 else 1  # prefill chunk or decode
            if todo <= 0:
                live[rid].append(rng.randrange(100))
            if not kv.append(rid, "main", q):
                continue
            if prefix_caching:
                kv.note_fed(rid, "main", have, live[rid][have : have + q])
            rows.append((rid, q))
        if not rows:
            continue
        batch = AttentionBatch.build([(rid, "main", q) for rid, q in rows], kv, "cpu")
        ref = _reference(rows, kv)
        for name, expected in ref.items():
            assert getattr(batch, name).tolist() == expected, (seed, steps, name)
        steps += 1
    assert steps > 100
    for rid in list(live):
        kv.free_request(rid)
    assert kv.num_used_blocks == 0


def test_a_row_whose_cache_is_short_is_refused() -> None:
    kv = KVCacheManager(1, 1, 4, block_size=4, num_blocks=8)
    kv.append("a", "main", 4)
    with pytest.raises(ValueError, match="holds 1 blocks of 4"):
        AttentionBatch.build([("a", "main", 1)], kv, "cpu", kv_lens=[5])
    with pytest.raises(ValueError, match="query_len must be >= 1"):
        AttentionBatch.build([("a", "main", 0)], kv, "cpu")
    empty = AttentionBatch.build([("a", "main", 4)], kv, "cpu")
    assert empty.slot_mapping.dtype == torch.int64 and empty.block_tables.dtype == torch.int32


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("prefix_caching", [False, True])
def test_decode_runs_built_on_the_last_step_equal_a_full_build(seed: int, prefix_caching: bool, monkeypatch) -> None:
    """A decode step over the same rows as the last one is built from it (``previous=``):
    over runs of decode steps broken by joins, leaves, preemptions, reorderings and prefill
    chunks, every step's metadata equals a full build and tables rebuilt per row."""
    advanced = []
    next_decode = AttentionBatch._next_decode.__func__

    def counted(cls, *args):  # noqa: ANN001, ANN202
        advanced.append(1)
        return next_decode(cls, *args)

    monkeypatch.setattr(AttentionBatch, "_next_decode", classmethod(counted))
    rng = random.Random(seed)
    kv = KVCacheManager(1, 1, 4, block_size=4, num_blocks=1024, prefix_caching=prefix_caching)
    fed: dict[str, list[int]] = {}
    order: list[str] = []
    made = 0
    previous = None
    for step in range(400):
        for rid in [r for r in order if len(fed[r]) > 40]:  # finished: a leave
            order.remove(rid)
            kv.free_request(rid)
            del fed[rid]
        event = rng.random()
        if event < 0.04 or len(order) < 5:  # a join: its prompt is fed in one chunk
            made += 1
            rid = f"r{made}"
            prompt = [7] * rng.choice([0, 4, 8]) + [rng.randrange(100) for _ in range(rng.randrange(1, 12))]
            fed[rid] = []
            hit = kv.map_prefix(rid, "main", prompt, len(prompt) - 1) if prefix_caching else 0
            fed[rid] = prompt[:hit]
            pending = {rid: prompt[hit:]}
            order.insert(rng.randrange(len(order) + 1), rid)
        elif event < 0.07:  # a leave
            rid = order.pop(rng.randrange(len(order)))
            kv.free_request(rid)
            del fed[rid]
            pending = {}
        elif event < 0.09:  # a preemption: freed, then its whole history fed again
            rid = rng.choice(order)
            history = fed[rid]
            kv.free_request(rid)
            fed[rid] = []
            pending = {rid: history}
        elif event < 0.11:  # the same rows in another order
            rng.shuffle(order)
            pending = {}
        elif event < 0.13:  # a row ran a step in a batch of its own since the last build
            rid = rng.choice(order)
            assert kv.append(rid, "main", 1)
            fed[rid] = fed[rid] + [rng.randrange(100)]
            pending = {}
        elif event < 0.15:  # preempted and recomputed since the last build, in another table row
            rid = rng.choice(order)
            kv.free_request(rid)
            kv.append("other", "main", 1)  # takes the freed row
            assert kv.append(rid, "main", len(fed[rid]))
            kv.free_request("other")
            pending = {}
        else:
            pending = {}
        rows = []
        for rid in order:
            tokens = pending.get(rid) or [rng.randrange(100)]  # a prefill chunk or one decode token
            have = kv.num_tokens(rid)
            assert kv.append(rid, "main", len(tokens))
            if prefix_caching:
                kv.note_fed(rid, "main", have, tokens)
            fed[rid] = fed[rid] + tokens
            rows.append((rid, len(tokens)))
        lens = [kv.num_tokens(rid) for rid, _ in rows]
        batch = AttentionBatch.build([(rid, "main", q) for rid, q in rows], kv, "cpu", lens, previous=previous)
        full = AttentionBatch.build([(rid, "main", q) for rid, q in rows], kv, "cpu", lens)
        for name, expected in _reference(rows, kv).items():
            assert getattr(batch, name).tolist() == expected, (seed, step, name)
        for name in ("qo_indptr", "kv_lens", "block_tables", "slot_mapping", "positions", "causal"):
            assert torch.equal(getattr(batch, name), getattr(full, name)), (seed, step, name)
        assert (batch.max_query_len, batch.max_kv_len, batch.rows) == (full.max_query_len, full.max_kv_len, full.rows)
        previous = batch
    assert len(advanced) > 200  # most steps were decode steps of the same rows


def test_a_decode_step_built_on_the_last_one_refuses_a_short_cache_too() -> None:
    kv = KVCacheManager(1, 1, 4, block_size=4, num_blocks=64)
    rows = [(f"r{i}", "main", 1) for i in range(6)]
    for rid, _, _ in rows:
        kv.append(rid, "main", 4)
    first = AttentionBatch.build(rows, kv, "cpu", [4] * 6)
    assert first.decode_run is not None
    with pytest.raises(ValueError, match="kv_len 5 but the cache holds 1 blocks of 4"):
        AttentionBatch.build(rows, kv, "cpu", [5] * 6, previous=first)  # nothing appended
