"""Mixed batches and the piecewise runner change how steps run, never what they produce."""

from __future__ import annotations

import torch
from toy_reference import GREEDY, prompts

SAMPLED = {"main": {"temperature": 0.9, "top_p": 0.9, "max_tokens": 12, "seed": 7}, "aux": {"residual": {"temperature": 1.0}}}


def run(engine, ps, sampling):
    res = engine.run_batch([{"inputs": {"prompt_ids": p}, "sampling": sampling} for p in ps])
    assert all(r.error is None for r in res)
    return [(r.cat("token").tolist(), r.cat("audio")) for r in res]


def test_mixed_batches_same_outputs_fewer_steps(make_engine):
    ps = prompts(12, seed=3)
    on, off = make_engine(mixed_batches=True), make_engine(mixed_batches=False)
    for sampling in (GREEDY, SAMPLED):
        a, b = run(on, ps, sampling), run(off, ps, sampling)
        assert [t for t, _ in a] == [t for t, _ in b]
        assert all(torch.equal(x, y) for (_, x), (_, y) in zip(a, b, strict=True))
    assert {k for k in on.core.stats.forwards_by_group if k.startswith("lm:")} == {"lm:mixed"}
    assert "lm:prefill" in off.core.stats.forwards_by_group


def drive_arrivals(engine, ps, sampling, every: int) -> tuple[list[list[int]], int]:
    """Drive the engine core by hand: one new request every ``every`` steps. Returns each
    request's tokens and the number of LM forwards."""
    from mstar.engine.request import Request

    core = engine.core
    pending = list(enumerate(ps))
    tokens: dict[str, list[int]] = {}
    finished: set[str] = set()
    step = 0
    while pending or core.has_work():
        if pending and step % every == 0:
            i, p = pending.pop(0)
            core.add_request(Request(f"r{i}", {"prompt_ids": p}, {}, engine.make_sampling(sampling), 0))
            tokens[f"r{i}"] = []
        for out in core.step():
            assert out.error is None
            if out.signal == "token":
                tokens[out.request_id].append(int(out.data))
            if out.finished:
                finished.add(out.request_id)
        step += 1
    lm_steps = sum(v for k, v in core.stats.forwards_by_group.items() if k.startswith("lm:"))
    return [tokens[f"r{i}"] for i in range(len(ps))], lm_steps


def test_mixed_batches_take_fewer_steps_under_arrivals(make_engine):
    ps = prompts(10, seed=6)
    on_tokens, on_steps = drive_arrivals(make_engine(mixed_batches=True), ps, GREEDY, every=2)
    off_tokens, off_steps = drive_arrivals(make_engine(mixed_batches=False), ps, GREEDY, every=2)
    assert on_tokens == off_tokens
    assert on_steps < off_steps


def test_late_prefills_share_forwards_with_running_decodes(make_engine):
    ps = prompts(10, seed=5)
    on, off = make_engine(mixed_batches=True), make_engine(mixed_batches=False)
    node = on.core.nodes["lm"]
    walks_per_forward: list[set[str]] = []
    run_rows = node.executor.run

    def spy(walk, rows):
        walks_per_forward.append({r.walk for r in rows})
        return run_rows(walk, rows)

    node.executor.run = spy
    on_tokens, _ = drive_arrivals(on, ps, GREEDY, every=3)
    off_tokens, _ = drive_arrivals(off, ps, GREEDY, every=3)
    assert on_tokens == off_tokens
    # Each late request's prefill ran in the same forward as earlier requests' decodes.
    assert sum(w == {"prefill", "decode"} for w in walks_per_forward) >= len(ps) - 1


def test_piecewise_region_gets_the_batch_sampler(make_engine):
    ps = prompts(8, seed=4)
    with_pw, without = make_engine(piecewise_graphs=True), make_engine(piecewise_graphs=False)
    runner = with_pw.core.nodes["lm"].piecewise["head"]
    seen = []
    original = runner.config.capture_fn

    def spy(static_inputs, sampler):
        seen.append(sampler)
        return original(static_inputs, sampler)

    object.__setattr__(runner.config, "capture_fn", spy)
    for sampling in (GREEDY, SAMPLED):
        assert [t for t, _ in run(with_pw, ps, sampling)] == [t for t, _ in run(without, ps, sampling)]
    assert runner.calls > 0 and len(seen) == runner.calls
    assert all(s is not None and hasattr(s, "sample_aux") for s in seen)
    assert without.core.nodes["lm"].piecewise == {}


def test_overlapping_nodes_changes_nothing(make_engine):
    """With overlap on, the decoder's batch runs on a worker thread beside the LM's, and each
    forward with half the torch threads (``cpu_threads``): equal bits assume products whose
    result does not depend on the thread count (MKL's strict mode, set by ``import mstar``;
    tests/core/test_blas_reproducibility.py)."""
    ps = prompts(8, seed=8)
    on, off = make_engine(overlap_nodes=True), make_engine(overlap_nodes=False)
    for sampling in (GREEDY, SAMPLED):
        a, b = run(on, ps, sampling), run(off, ps, sampling)
        assert [t for t, _ in a] == [t for t, _ in b]
        assert all(torch.equal(x, y) for (_, x), (_, y) in zip(a, b, strict=True))
    assert on.core.overlap.batches > 0  # the overlapped path actually ran
    assert off.core.overlap.batches == 0
