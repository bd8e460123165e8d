"""Tensor parallelism on CPU: two ranks over gloo, each its own process and engine, the text
LM fixture's attention heads, MLP columns and LM head rows split between them
(mstar.parallel.shard), the follower stepping with rank 0 (mstar.engine.lockstep). Greedy
ids equal one device's, logits within 1e-5, also under preemption (both sides given the
same number of KV blocks)."""

from __future__ import annotations

import multiprocessing as mp
import socket
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
BENCHMARKS = Path(__file__).resolve().parents[3] / "benchmarks"
TOKENS = 24


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _requests(n: int) -> list[dict]:
    g = torch.Generator().manual_seed(7)
    return [{"inputs": {"prompt_ids": torch.randint(0, 383, (5 + 3 * i,), generator=g)},
             "sampling": {"temperature": 0, "max_tokens": TOKENS, "ignore_eos": True},
             "kwargs": {"return_logits": True}} for i in range(n)]


def _engine(ckpt: Path, kv_budget: int, **tp: object):
    sys.path.insert(0, str(BENCHMARKS))
    from mstar import Engine
    from mstar.engine.builder import EngineConfig, build_core
    from text_lm_overhead import load_text_plugin

    loaded = load_text_plugin()
    config = EngineConfig(dtype="float32", kv_budget_bytes=kv_budget, block_size=16, max_num_seqs=16, **tp)
    return Engine(build_core(loaded, ckpt, config), loaded, ckpt)


def _run(engine, n: int) -> tuple[list[list[int]], list[torch.Tensor], int]:
    results = engine.run_batch(_requests(n))
    assert all(r.error is None for r in results), [r.error for r in results]
    return ([r.cat("tokens").tolist() for r in results], [torch.stack(r.signals["logits"]) for r in results],
            engine.core.stats.preemptions)


def _rank(rank: int, size: int, port: int, ckpt: str, kv_budget: int, n: int, out: mp.Queue) -> None:
    torch.set_num_threads(1)
    try:
        engine = _engine(Path(ckpt), kv_budget, tensor_parallel_size=size, tensor_parallel_rank=rank,
                         tensor_parallel_init=f"tcp://127.0.0.1:{port}")
        heads = engine.core.nodes["lm"].kv.num_kv_heads
        if rank == 0:
            tokens, logits, preemptions = _run(engine, n)
            engine.close()
            # numpy: pickled, not shared memory the child takes with it when it exits
            out.put((rank, heads, tokens, [x.numpy() for x in logits], (preemptions, engine.core.stats.steps)))
        else:
            out.put((rank, heads, engine.follow(), None, None))
    except BaseException as exc:  # reported to the test, not lost in the child
        out.put((rank, None, repr(exc), None, None))
        raise


def _tensor_parallel(ckpt: Path, kv_budget: int, n: int, size: int = 2) -> dict[int, tuple]:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank, args=(r, size, port, str(ckpt), kv_budget, n, out)) for r in range(size)]
    for p in procs:
        p.start()
    got = {}
    for _ in range(size):
        rank, *rest = out.get(timeout=300)
        got[rank] = tuple(rest)
    for p in procs:
        p.join(timeout=60)
    assert all(v[0] is not None for v in got.values()), got
    return got


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    sys.path.insert(0, str(BENCHMARKS))
    from text_lm_overhead import write_checkpoint

    # 4 query heads and 2 key/value heads: one of each key/value head per rank.
    return write_checkpoint(tmp_path_factory.mktemp("tp-ckpt"), 64, 2, 384, 512)


@pytest.mark.parametrize("preempt", [False, True])
def test_two_ranks_equal_one_device(ckpt: Path, preempt: bool) -> None:
    n = 6
    # 2 layers x K,V x 2 kv heads x 16 dims x 16 positions x 4 bytes = 8 KiB a block on one
    # device, 4 KiB on each rank (one kv head): 10 blocks each way.
    one_budget = (10 if preempt else 200) * 8192
    one = _engine(ckpt, one_budget)
    tokens, logits, preemptions = _run(one, n)
    one.close()
    got = _tensor_parallel(ckpt, one_budget // 2, n)
    heads0, tp_tokens, tp_logits, (tp_preemptions, leader_steps) = got[0]
    heads1, follower_steps, _, _ = got[1]
    assert heads0 == heads1 == 1  # each rank holds one of the two key/value heads
    assert tp_tokens == tokens
    for a, b in zip(tp_logits, logits, strict=True):
        torch.testing.assert_close(torch.from_numpy(a), b, rtol=1e-5, atol=1e-5)
    assert follower_steps == leader_steps >= TOKENS  # the follower stepped with rank 0, every step
    assert (tp_preemptions > 0) == preempt and tp_preemptions == preemptions
