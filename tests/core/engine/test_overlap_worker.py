"""overlap_nodes: the decoder's batch runs on a worker thread across several LM steps and
the LM does not wait for it, except for a stream's first chunk (a request's time to first
output); a request that ends while its batch is on the worker frees its resources only once
the worker is done."""

from __future__ import annotations

import threading

import torch
from mstar.engine.request import Request
from test_mixed_and_piecewise import SAMPLED, run
from toy_reference import GREEDY, prompts

HOLD_S = 10.0  # upper bound on how long a held decoder call waits for the LM
FIRST_HOLD_S = 0.5  # how long a first chunk's call gives the LM to step past it
LONG = 64  # tokens per request: several decoder chunks per stream


def later_chunks(rows) -> bool:
    """Whether no row of the batch holds its stream's first chunk."""
    return all(r.req.streams[s].consumed > 0 for r in rows for s in r.prepared.stream_ends)


def long(sampling: dict) -> dict:
    return {**sampling, "main": {**sampling["main"], "max_tokens": LONG}}


def hold_decoder_until_lm_steps(engine, lm_steps: int) -> tuple[list[int], list[int]]:
    """Make each decoder forward of later chunks wait until the LM has run ``lm_steps`` more
    forwards (or HOLD_S passed); returns how many LM forwards ran during each decoder forward
    of first chunks, and of later chunks."""
    lm, dec = engine.core.nodes["lm"], engine.core.nodes["decoder"]
    lm_run, dec_run = lm.executor.run, dec.executor.run
    count = [0]
    moved = threading.Condition()
    first: list[int] = []
    later: list[int] = []

    def counting_lm(walk, rows):
        out = lm_run(walk, rows)
        with moved:
            count[0] += 1
            moved.notify_all()
        return out

    def held_decoder(walk, rows):
        start = count[0]
        if not later_chunks(rows):  # give the LM time to step, which it must not use
            with moved:
                moved.wait_for(lambda: count[0] - start >= 2 or not lm_has_work(), timeout=FIRST_HOLD_S)
            first.append(count[0] - start)
            return dec_run(walk, rows)
        with moved:
            moved.wait_for(lambda: count[0] - start >= lm_steps or not lm_has_work(), timeout=HOLD_S)
        later.append(count[0] - start)
        return dec_run(walk, rows)

    lm_partition = engine.core.graph.walks["decode"].partition

    def lm_has_work() -> bool:  # the LM may finish before the held call is released
        return any(not r.cursors[lm_partition].done for r in list(engine.core.running.values()))

    lm.executor.run, dec.executor.run = counting_lm, held_decoder
    return first, later


def test_decoder_batch_spans_several_lm_steps(make_engine):
    """Equal bits with overlap on (1 torch thread a forward on a 2-core host) and off (2)
    assume thread-count independent products (MKL's strict mode, set by ``import mstar``)."""
    ps = prompts(6, seed=11)
    on, off = make_engine(overlap_nodes=True), make_engine(overlap_nodes=False)
    first, later = hold_decoder_until_lm_steps(on, 3)
    for sampling in (GREEDY, SAMPLED):
        a, b = run(on, ps, long(sampling)), run(off, ps, long(sampling))
        assert [t for t, _ in a] == [t for t, _ in b]
        assert all(torch.equal(x, y) for (_, x), (_, y) in zip(a, b, strict=True))
    # While a decoder call of later chunks was held, the LM went on stepping on the engine's
    # thread; a first chunk's call overlapped at most the one LM step that started with it.
    assert later and max(later) >= 3, later
    assert first and max(first) <= 1, first
    assert on.core.overlap.batches > 0


def test_request_aborted_while_on_the_worker_frees_after(make_engine):
    engine = make_engine(overlap_nodes=True)
    core = engine.core
    dec = core.nodes["decoder"]
    dec_run, emit, free = dec.executor.run, core._emit, core._free
    events: list[str] = []
    on_worker, aborted = threading.Event(), threading.Event()

    def held_decoder(walk, rows):
        on_thread = threading.current_thread().name.startswith("mstar-overlap")
        if on_thread and later_chunks(rows) and not on_worker.is_set():
            on_worker.set()
            assert aborted.wait(HOLD_S)  # the request ends while its batch is here
            events.append("worker done")
        return dec_run(walk, rows)

    def recording_emit(out):
        if out.finished:
            events.append(f"finished {out.finish_reason}")
            aborted.set()
        emit(out)

    def recording_free(req):
        events.append(f"freed {req.id}, {core.nodes['lm'].kv.num_tokens(req.id, 'main')} cached")
        free(req)

    dec.executor.run, core._emit, core._free = held_decoder, recording_emit, recording_free
    core.add_request(Request("r0", {"prompt_ids": prompts(1, seed=2)[0]}, {}, engine.make_sampling(long(GREEDY)), 0))
    while not on_worker.is_set():
        core.step()
    assert core.overlap.holds("r0")
    core.abort("r0")
    while core.has_work():
        core.step()
    # Finished once (not again when the worker's batch came back), freed only after it did.
    assert events[0] == "finished abort" and events[1] == "worker done", events
    assert events[2].startswith("freed r0,") and not events[2].endswith(" 0 cached"), events
    assert len(events) == 3, events
    kv = core.nodes["lm"].kv
    assert kv.num_free_blocks == kv.num_blocks and "r0" not in core.running


def record_threads(engine) -> dict[str, set[tuple[str, int]]]:
    """Per node, the (thread name, torch thread count) of every forward it ran."""
    seen: dict[str, set[tuple[str, int]]] = {}
    for name, node in engine.core.nodes.items():
        inner = node.executor.run

        def counted(walk, rows, name=name, inner=inner):
            seen.setdefault(name, set()).add((threading.current_thread().name, torch.get_num_threads()))
            return inner(walk, rows)

        node.executor.run = counted
    return seen


def test_engine_threads_split_the_cores_when_two_forwards_run_at_once(make_engine):
    """With overlap_nodes the engine's loop and its worker each run forwards with half the
    builder's torch threads (two full OpenMP teams would spin over each other's cores);
    without it, or with cpu_threads, the count is what was asked."""
    before = torch.get_num_threads()
    torch.set_num_threads(4)
    try:
        split, whole = make_engine(overlap_nodes=True), make_engine(overlap_nodes=False)
        pinned = make_engine(overlap_nodes=True, cpu_threads=3)
    finally:
        torch.set_num_threads(before)
    ps = prompts(4, seed=5)
    for engine, threads in ((split, 2), (whole, 4), (pinned, 3)):
        seen = record_threads(engine)
        run(engine, ps, long(GREEDY))
        assert set(seen) == {"lm", "decoder"}
        assert {n for s in seen.values() for _, n in s} == {threads}, seen
    assert any(t.startswith("mstar-overlap") for t, _ in seen["decoder"] | seen["lm"])
    assert torch.get_num_threads() == before  # the caller's own thread is left alone


def test_overlap_worker_pins_its_thread_when_stepped_from_another(make_engine):
    """Stepped from the caller's thread (not the engine's loop), the worker still runs its
    forwards with the engine's count, not the caller's."""
    before = torch.get_num_threads()
    torch.set_num_threads(4)
    try:
        engine = make_engine(overlap_nodes=True)
        seen = record_threads(engine)
        core = engine.core
        for i, p in enumerate(prompts(3, seed=6)):
            core.add_request(Request(f"r{i}", {"prompt_ids": p}, {}, engine.make_sampling(long(GREEDY)), 0))
        while core.has_work():
            core.step()
        on_worker = {n for s in seen.values() for t, n in s if t.startswith("mstar-overlap")}
        assert on_worker == {2}, seen
        assert torch.get_num_threads() == 4  # stepping does not change the caller's thread
    finally:
        torch.set_num_threads(before)
