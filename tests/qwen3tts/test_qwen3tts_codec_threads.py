"""Two codec batches at once: with ``overlap_nodes`` (the plugin's default) and a codec whose
forwards may run concurrently, the engine's thread decodes one batch while the worker
decodes another (the first chunks of a burst, the last round once the talker is done), and
every request's codes and audio stay what they are alone."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from mstar_qwen3tts.codec_node import CodecNode
from mstar_qwen3tts.tiny_checkpoint import write_checkpoint
from qwen3tts_helpers import sampling, speech_inputs


@pytest.fixture(scope="module")
def two_row_ckpt(tmp_path_factory: pytest.TempPathFactory):
    # Calls of two rows: six requests need three calls a round.
    return write_checkpoint(tmp_path_factory.mktemp("qwen3tts-two-rows"), overrides={"mstar_streaming": {"codec_batch": 2}})


def _requests(ckpt):
    return [
        {"inputs": speech_inputs(ckpt, f"Request number {i}, said at the same time."),
         "sampling": sampling({"seed": 30 + i, "max_tokens": 16, "min_tokens": 16}, {})}
        for i in range(6)
    ]


def _run_recording(engine, requests, monkeypatch) -> tuple[list, list[tuple[str, float, float]]]:
    node = engine.core.nodes["codec"].submodule
    calls: list[tuple[str, float, float]] = []
    forward = node.forward_batched

    def timed(*args, **kwargs):
        start = time.perf_counter()
        out = forward(*args, **kwargs)
        time.sleep(0.02)  # long enough that a concurrent call on the other thread shows
        calls.append((threading.current_thread().name, start, time.perf_counter()))
        return out

    monkeypatch.setattr(node, "forward_batched", timed)
    try:
        return engine.run_batch(requests), calls
    finally:
        monkeypatch.undo()


def _overlapping(calls) -> bool:
    return any(a[0] != b[0] and a[1] < b[2] and b[1] < a[2] for i, a in enumerate(calls) for b in calls[i + 1 :])


def test_the_engine_thread_decodes_beside_the_worker(engines, two_row_ckpt, monkeypatch) -> None:
    engine = engines(two_row_ckpt)
    requests = _requests(two_row_ckpt)
    alone = [engine.run_batch([r])[0] for r in requests]
    together, calls = _run_recording(engine, requests, monkeypatch)
    assert _overlapping(calls), "no two codec batches ran at once"
    for got, want in zip(together, alone, strict=True):
        assert got.error is None and want.error is None
        assert torch.equal(got.cat("codes"), want.cat("codes"))
        assert got.cat("audio").numpy().tobytes() == want.cat("audio").numpy().tobytes()


def test_a_node_without_concurrent_forwards_runs_one_batch_at_a_time(engines, two_row_ckpt, monkeypatch) -> None:
    engine = engines(two_row_ckpt)
    monkeypatch.setattr(CodecNode, "concurrent_forwards", False)
    _, calls = _run_recording(engine, _requests(two_row_ckpt), monkeypatch)
    assert len(calls) >= 6 and not _overlapping(calls)
