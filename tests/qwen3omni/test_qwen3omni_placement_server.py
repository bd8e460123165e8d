"""``mstar serve --model qwen3omni --random-weights`` with Thinker (and its encoders), Talker
and Code2Wav in three engine processes: the streams between the partitions cross processes,
and a spoken request's text ids, codes and audio equal one in-process engine's; a text-only
request never reaches the Talker's or Code2Wav's process."""

from __future__ import annotations

import time

import httpx
import pytest
import torch
from omni_server import omni_server

pytestmark = pytest.mark.e2e

PLACEMENT = """
groups:
  thinker: {device: cpu, nodes: [thinker, audio_encoder, vision_encoder]}
  talker: {device: cpu, nodes: [talker]}
  code2wav: {device: cpu, nodes: [code2wav]}
"""
PROMPT = [151644, 872, 198, 100, 101, 102, 103, 151645, 198, 151644, 77091, 198]
SPEECH = {"modalities": ["text", "audio"], "voice": "Aiden"}
SAMPLING = {
    "thinker": {"temperature": 0.8, "seed": 3, "max_tokens": 8},
    "talker": {"main": {"seed": 5, "max_tokens": 24, "min_tokens": 10}, "aux": {"code_predictor": {"seed": 7}}},
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("qwen3omni-placement")
    (tmp / "placement.yaml").write_text(PLACEMENT)
    with omni_server(["--config", str(tmp / "placement.yaml"), "--preprocess-workers", "0"], tmp / "server.log") as url:
        yield url


def _generate(url: str, kwargs: dict) -> dict[str, torch.Tensor]:
    from mstar.api.tensors import tensor_from_json

    body = {"model": "qwen3omni", "inputs": {"prompt_ids": PROMPT}, "sampling": SAMPLING, "kwargs": kwargs}
    reply = httpx.post(f"{url}/v1/generate", json=body, timeout=300)
    assert reply.status_code == 200, reply.text
    return {name: tensor_from_json(value, name) for name, value in reply.json()["outputs"].items()}


def test_three_processes_equal_one_engine(server):
    from mstar import Engine

    health = httpx.get(f"{server}/health").json()
    assert {name: e["nodes"] for name, e in health["engines"].items()} == {
        "thinker": ["thinker", "audio_encoder", "vision_encoder"], "talker": ["talker"], "code2wav": ["code2wav"],
    }
    served = _generate(server, SPEECH)
    # The server's engines run one torch thread each (omni_server); so does this engine, since
    # Code2Wav's convolutions may round differently with another thread count on some CPUs.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with Engine.from_model("qwen3omni", random_weights=True) as engine:
            local = engine.run_batch([{"inputs": {"prompt_ids": torch.tensor(PROMPT)}, "sampling": SAMPLING, "kwargs": SPEECH}])[0]
    finally:
        torch.set_num_threads(threads)
    assert local.error is None, local.error
    assert served["tokens"].reshape(-1).tolist() == local.cat("tokens").tolist()
    codes = torch.cat(local.signals["codes"])
    assert codes.shape[0] >= 10 and torch.equal(served["codes"].reshape(codes.shape), codes)
    assert torch.equal(served["audio"].reshape(-1), local.cat("audio"))


def _taken_in(url: str) -> dict[str, float]:
    """``mstar_engine_requests`` per engine (placement group)."""
    import re

    found = {}
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        m = re.match(r'mstar_engine_requests\{.*engine="(\w+)".*\} ([0-9.e+]+)', line)
        if m:
            found[m.group(1)] = float(m.group(2))
    return found


def test_text_only_requests_reach_only_the_thinker(server):
    before = _taken_in(server)
    text = _generate(server, {})
    spoken = _generate(server, SPEECH)
    assert set(text) == {"tokens"} and text["tokens"].numel() == 8 and "audio" in spoken
    deadline = time.monotonic() + 30
    while (after := _taken_in(server))["thinker"] < before["thinker"] + 2:  # engines report every so often
        assert time.monotonic() < deadline, after
        time.sleep(0.5)
    while after["talker"] < before["talker"] + 1 or after["code2wav"] < before["code2wav"] + 1:
        assert time.monotonic() < deadline, after
        time.sleep(0.5)
        after = _taken_in(server)
    time.sleep(2)  # a late report would show a second request
    after = _taken_in(server)
    assert after == {"thinker": before["thinker"] + 2, "talker": before["talker"] + 1, "code2wav": before["code2wav"] + 1}
