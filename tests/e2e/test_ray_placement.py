"""``mstar serve --placement-backend ray`` on a two-node Ray cluster started by the test
(``ray.cluster_utils.Cluster``; nodes told apart by custom resources): each group's engine is
a Ray actor on the node its resources name, reached over TCP. Outputs equal the one-process
engine's for the toy and Orpheus; killing one actor fails only the requests it held, /health
reports it, and the group comes back; a peer without the server's secret cannot command an
engine's TCP socket."""

from __future__ import annotations

import importlib.util
import os
import signal
import threading
import time
from pathlib import Path
from types import ModuleType

import httpx
import pytest
import torch


def _load_conftest() -> ModuleType:
    # By path: another test folder's conftest may own the name "conftest".
    spec = importlib.util.spec_from_file_location("ray_e2e_conftest", Path(__file__).with_name("conftest.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module



ServerProcess = _load_conftest().ServerProcess
ray = pytest.importorskip("ray", reason="Ray is not installed: pip install 'mstar-core[ray]' (CI installs it)")

pytestmark = [pytest.mark.e2e, pytest.mark.ray]

NODE_ARGS = {"num_cpus": 2, "object_store_memory": 80 << 20}
# Two engines of each server land on each node; both servers may run at once.
TOY_PLACEMENT = """
groups:
  lm_group: {device: cpu, nodes: [lm], resources: {node_a: 1}}
  decoder_group: {device: cpu, nodes: [decoder], resources: {node_b: 1}}
"""
ORPHEUS_PLACEMENT = """
groups:
  lm_group: {device: cpu, nodes: [lm], resources: {node_a: 1}}
  snac_group: {device: cpu, nodes: [snac], resources: {node_b: 1}}
"""
TOY_REQUESTS = [
    ("across nodes", {"temperature": 0, "seed": 77, "max_tokens": 30}),
    ("seeded sampling", {"temperature": 1.0, "top_k": 50, "seed": 1234, "max_tokens": 40}),
]
ORPHEUS_SAMPLING = {"temperature": 0.8, "seed": 11, "max_tokens": 48, "ignore_eos": True}


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={**NODE_ARGS, "resources": {"node_a": 2}, "include_dashboard": False})
    c.add_node(**NODE_ARGS, resources={"node_b": 2})
    c.wait_for_nodes()
    yield c
    c.shutdown()


def _serve(start_server, tmp_path_factory, cluster, placement: str, extra: list[str]):
    path = tmp_path_factory.mktemp("ray-placement") / "placement.yaml"
    path.write_text(placement)
    return start_server([*extra, "--config", str(path), "--placement-backend", "ray", "--ray-address", cluster.address,
                         "--preprocess-workers", "0", "--shutdown-timeout", "5"])


@pytest.fixture(scope="module")
def toy_server(start_server, tmp_path_factory, cluster):
    srv = _serve(start_server, tmp_path_factory, cluster, TOY_PLACEMENT, [])
    yield srv
    if srv.proc.poll() is None:
        assert srv.stop() == 0, srv.log_tail()


@pytest.fixture(scope="module")
def orpheus_ckpt(tmp_path_factory):
    from mstar_orpheus.checkpoint import write_checkpoint

    return write_checkpoint(tmp_path_factory.mktemp("orpheus-ray"), seed=3)


@pytest.fixture(scope="module")
def orpheus_prompt(orpheus_ckpt) -> list[int]:
    from mstar_orpheus.config import load_config
    from mstar_orpheus.tokens import OrpheusTokens

    config = load_config(orpheus_ckpt)
    tokens = OrpheusTokens.from_dict(config["orpheus"])
    return [tokens.start_of_human, int(config.get("bos_token_id", 128000)), *range(70, 82), *tokens.prompt_suffix]


@pytest.fixture(scope="module")
def orpheus_server(tmp_path_factory, cluster, orpheus_ckpt):
    def start(args: list[str]):
        srv = ServerProcess(["--model", "orpheus", "--weights", str(orpheus_ckpt), *args], tmp_path_factory.mktemp("orpheus-ray") / "server.log")
        servers.append(srv)
        srv.start()
        return srv

    servers: list = []
    try:
        srv = _serve(start, tmp_path_factory, cluster, ORPHEUS_PLACEMENT, [])
        yield srv
        assert srv.stop() == 0, srv.log_tail()
    finally:
        for s in servers:
            s.kill_all()


def _generate(server, model: str, prompt: list[int], sampling: dict) -> dict:
    body = {"model": model, "inputs": {"prompt_ids": prompt}, "sampling": sampling}
    r = httpx.post(f"{server.url}/v1/generate", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def _outputs(out: dict) -> tuple[torch.Tensor, torch.Tensor]:
    from mstar.api.tensors import tensor_from_json

    return tensor_from_json(out["outputs"]["token"], "token"), tensor_from_json(out["outputs"]["audio"], "audio")


def _one_process(model: str, ckpt, requests: list[tuple[list[int], dict]]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    from mstar import Engine

    with Engine.from_model(model, weights=ckpt) as engine:
        outs = engine.run_batch([{"inputs": {"prompt_ids": torch.tensor(p)}, "sampling": s} for p, s in requests])
    return [(o.cat("token"), o.cat("audio")) for o in outs]


def test_groups_run_as_actors_on_the_nodes_their_resources_name(toy_server, cluster):
    engines = toy_server.health().json()["engines"]
    ray.init(address=cluster.address, namespace="mstar-test")
    try:
        nodes = {n["NodeID"]: n["Resources"] for n in ray.nodes() if n["Alive"]}
    finally:
        ray.shutdown()
    placed = {name: nodes[e["ray_node_id"]] for name, e in engines.items()}
    assert "node_a" in placed["lm_group"] and "node_b" not in placed["lm_group"]
    assert "node_b" in placed["decoder_group"] and "node_a" not in placed["decoder_group"]
    assert all(e["command_addr"].startswith("tcp://") for e in engines.values())


def test_toy_outputs_equal_one_process(toy_server, toy_checkpoint):
    requests = [([256, *text.encode()], s) for text, s in TOY_REQUESTS]
    reference = _one_process("toy", toy_checkpoint, requests)
    for (prompt, sampling), (tokens, audio) in zip(requests, reference, strict=True):
        got_tokens, got_audio = _outputs(_generate(toy_server, "toy", prompt, sampling))
        assert torch.equal(got_tokens, tokens)
        assert torch.equal(got_audio, audio)


def test_orpheus_outputs_equal_one_process(orpheus_server, orpheus_ckpt, orpheus_prompt):
    [(tokens, audio)] = _one_process("orpheus", orpheus_ckpt, [(orpheus_prompt, ORPHEUS_SAMPLING)])
    assert audio.numel() > 0
    got_tokens, got_audio = _outputs(_generate(orpheus_server, "orpheus", orpheus_prompt, ORPHEUS_SAMPLING))
    assert torch.equal(got_tokens, tokens)
    assert torch.equal(got_audio, audio)


def test_a_peer_without_the_secret_cannot_command_an_engine(toy_server):
    import zmq
    from mstar.server.messages import Shutdown, command_encoder

    engines = toy_server.health().json()["engines"]
    ctx = zmq.Context()
    try:
        for e in engines.values():
            sock = ctx.socket(zmq.PUSH)
            sock.setsockopt(zmq.LINGER, 2000)
            sock.connect(e["command_addr"])
            shutdown = command_encoder.encode(Shutdown())
            sock.send_multipart([b"not-the-secret" * 3, shutdown])  # a wrong secret
            sock.send_multipart([shutdown])  # none at all
            sock.close()
    finally:
        ctx.term()
    time.sleep(1.5)  # what an accepted Shutdown would need to end the engine
    after = toy_server.health().json()
    assert after["status"] == "ok"
    assert {n: e["pid"] for n, e in after["engines"].items()} == {n: e["pid"] for n, e in engines.items()}
    assert "dropped a message without the server's secret" in toy_server.log_tail(400)
    prompt, sampling = [256, *b"still serving"], {"temperature": 0, "max_tokens": 8}
    assert _outputs(_generate(toy_server, "toy", prompt, sampling))[0].numel() == 8


def test_killed_actor_fails_only_its_requests_and_comes_back(toy_server, orpheus_server, orpheus_ckpt, orpheus_prompt, toy_checkpoint):
    """The toy's decoder actor dies (SIGKILL) while a toy request and an Orpheus request
    (whose snac actor shares that node) stream: the toy request fails at once, the Orpheus
    one completes with the one-process output; the toy's group restarts and serves again."""
    [(orpheus_tokens, orpheus_audio)] = _one_process("orpheus", orpheus_ckpt, [(orpheus_prompt, ORPHEUS_SAMPLING | {"max_tokens": 400})])
    victim = toy_server.health().json()["engines"]["decoder_group"]["pid"]
    results: dict[str, object] = {}
    streaming = threading.Barrier(3, timeout=60)

    def toy_stream() -> None:
        body = {"model": "toy", "input": "x", "response_format": "pcm", "stream_format": "audio", "max_tokens": 4000, "ignore_eos": True}
        try:
            with httpx.stream("POST", f"{toy_server.url}/v1/audio/speech", json=body, timeout=60) as r:
                for i, _ in enumerate(r.iter_raw()):
                    if i == 1:
                        streaming.wait()
            results["toy"] = "complete"
        except httpx.HTTPError as exc:
            results["toy"] = type(exc).__name__

    def orpheus_request() -> None:
        streaming.wait()
        results["orpheus"] = _generate(orpheus_server, "orpheus", orpheus_prompt, ORPHEUS_SAMPLING | {"max_tokens": 400})

    threads = [threading.Thread(target=toy_stream), threading.Thread(target=orpheus_request)]
    for t in threads:
        t.start()
    streaming.wait()
    t0 = time.monotonic()
    os.kill(victim, signal.SIGKILL)
    threads[0].join(30)
    failed_after = time.monotonic() - t0
    health = toy_server.health().json()
    threads[1].join(120)
    assert results["toy"] != "complete", "the toy stream survived its engine's death"
    assert failed_after < 10
    assert health["status"] in ("restarting", "unhealthy") and health["engines"]["decoder_group"]["alive"] is False
    assert "Ray actor died" in health["engines"]["decoder_group"].get("last_exit", "")
    got_tokens, got_audio = _outputs(results["orpheus"])  # type: ignore[arg-type]
    assert torch.equal(got_tokens, orpheus_tokens) and torch.equal(got_audio, orpheus_audio)

    deadline = time.monotonic() + 90
    while toy_server.health().json()["status"] != "ok":
        assert time.monotonic() < deadline, toy_server.log_tail()
        time.sleep(0.5)
    back = toy_server.health().json()["engines"]["decoder_group"]
    assert back["pid"] != victim and back["restarts"] == 1
    requests = [([256, *TOY_REQUESTS[0][0].encode()], TOY_REQUESTS[0][1])]
    [(tokens, audio)] = _one_process("toy", toy_checkpoint, requests)
    got_tokens, got_audio = _outputs(_generate(toy_server, "toy", *requests[0]))
    assert torch.equal(got_tokens, tokens) and torch.equal(got_audio, audio)
