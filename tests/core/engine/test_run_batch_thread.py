"""``Engine.run_batch`` steps on the caller's thread while no loop thread runs (OpenMP pools:
see ``Engine._drive``), with the engine's torch threads for the time, and gives the same
outputs as the loop thread; once the loop thread runs, run_batch leaves the steps to it."""

from __future__ import annotations

import threading

import torch
from test_mixed_and_piecewise import SAMPLED, run
from test_overlap_worker import long, record_threads
from toy_reference import GREEDY, prompts


def test_run_batch_steps_on_the_callers_thread_until_a_loop_thread_exists(make_engine):
    ps = prompts(5, seed=9)
    engine = make_engine()
    seen = record_threads(engine)
    sync = [run(engine, ps, s) for s in (GREEDY, long(SAMPLED))]
    here = threading.current_thread().name
    assert {t for s in seen.values() for t, _ in s} == {here}
    assert engine._thread is None

    engine.add_request({"prompt_ids": ps[0]}, GREEDY)  # starts the loop thread
    for s in seen.values():
        s.clear()
    looped = [run(engine, ps, s) for s in (GREEDY, long(SAMPLED))]
    assert {t for s in seen.values() for t, _ in s} == {"mstar-engine"}
    for a, b in zip(sync, looped, strict=True):
        assert [t for t, _ in a] == [t for t, _ in b]
        assert all(torch.equal(x, y) for (_, x), (_, y) in zip(a, b, strict=True))


def test_run_batch_on_the_callers_thread_uses_the_engines_thread_count(make_engine):
    before = torch.get_num_threads()
    torch.set_num_threads(4)
    try:
        engine = make_engine(overlap_nodes=True)  # two threads of 2
        seen = record_threads(engine)
        run(engine, prompts(3, seed=4), long(GREEDY))
        assert torch.get_num_threads() == 4  # the caller's count is back afterwards
    finally:
        torch.set_num_threads(before)
    main = threading.current_thread().name
    on_caller = {n for s in seen.values() for t, n in s if t == main}
    assert on_caller == {2}, seen
