"""A two-process placement (LM in one engine process, decoder in another, the streaming
edge between them crossing processes) gives the same outputs as one process."""

from __future__ import annotations

import httpx
import pytest
import torch

pytestmark = pytest.mark.e2e

PLACEMENT = """
groups:
  lm_group: {device: cpu, nodes: [lm]}
  decoder_group: {device: cpu, nodes: [decoder]}
"""

REQUESTS = [
    ("two processes", {"temperature": 0, "seed": 77, "max_tokens": 30}),  # the aux sampler still samples
    ("seeded sampling", {"temperature": 1.0, "top_k": 50, "seed": 1234, "max_tokens": 40}),
    ("short", {"temperature": 0.7, "seed": 5, "max_tokens": 3}),
]


@pytest.fixture(scope="module")
def server(start_server, tmp_path_factory):
    path = tmp_path_factory.mktemp("placement") / "placement.yaml"
    path.write_text(PLACEMENT)
    # --shm-threshold 0: every tensor, forwarded stream items included, uses shared memory.
    srv = start_server(["--config", str(path), "--shm-threshold", "0", "--preprocess-workers", "1", "--shutdown-timeout", "5"])
    yield srv
    if srv.proc.poll() is None:
        assert srv.stop() == 0, srv.log_tail()
    srv.assert_clean_exit()


@pytest.fixture(scope="module")
def reference(toy_checkpoint):
    from mstar import Engine

    with Engine.from_model("toy", weights=toy_checkpoint) as engine:
        outs = engine.run_batch(
            [{"inputs": {"prompt_ids": torch.tensor([256, *text.encode()])}, "sampling": s} for text, s in REQUESTS]
        )
    return [(o.cat("token"), o.cat("audio")) for o in outs]


def test_two_engine_processes(server):
    health = server.health().json()
    assert {name: e["nodes"] for name, e in health["engines"].items()} == {"lm_group": ["lm"], "decoder_group": ["decoder"]}


@pytest.mark.parametrize("i", range(len(REQUESTS)))
def test_outputs_match_single_process(server, reference, i):
    from mstar.api.tensors import tensor_from_json

    text, sampling = REQUESTS[i]
    body = {"model": "toy", "inputs": {"prompt_ids": [256, *text.encode()]}, "sampling": sampling}
    out = httpx.post(f"{server.url}/v1/generate", json=body, timeout=60).json()
    tokens, audio = reference[i]
    assert torch.equal(tensor_from_json(out["outputs"]["token"], "token"), tokens)
    assert torch.equal(tensor_from_json(out["outputs"]["audio"], "audio"), audio)


def test_concurrent_speech_across_processes(server):
    import concurrent.futures

    body = {"model": "toy", "input": "cross-process", "response_format": "pcm", "seed": 9, "max_tokens": 32}
    alone = httpx.post(f"{server.url}/v1/audio/speech", json=body, timeout=60).content
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        together = list(pool.map(lambda _: httpx.post(f"{server.url}/v1/audio/speech", json=body, timeout=60).content, range(8)))
    assert alone and all(t == alone for t in together)


def test_sigterm_with_streams_in_flight_exits_cleanly(server):
    """Last in this module: SIGTERM while requests stream through both engine processes."""
    import signal
    import threading

    ended: list[str] = []
    started = threading.Barrier(3, timeout=30)

    def stream() -> None:
        body = {"model": "toy", "input": "x", "response_format": "pcm", "stream_format": "audio", "max_tokens": 480, "ignore_eos": True}
        try:
            with httpx.stream("POST", f"{server.url}/v1/audio/speech", json=body, timeout=30) as r:
                for i, _ in enumerate(r.iter_raw()):
                    if i == 2:
                        started.wait()
            ended.append("complete")
        except httpx.HTTPError as exc:
            ended.append(type(exc).__name__)

    threads = [threading.Thread(target=stream) for _ in range(2)]
    for t in threads:
        t.start()
    started.wait()
    assert server.stop(signal.SIGTERM, timeout=30) == 0, server.log_tail()
    for t in threads:
        t.join(15)
        assert not t.is_alive()
    assert len(ended) == 2
    server.assert_clean_exit()
