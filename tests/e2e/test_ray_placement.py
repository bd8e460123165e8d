"""``mstar serve --placement-backend ray`` on a two-node Ray cluster started by the test
(``ray.cluster_utils.Cluster``; nodes told apart by custom resources): each group's engine is
a Ray actor on the node its resources name, reached over TCP. Outputs equal the one-process
engine's for the toy and Orpheus; killing one actor fails only the requests it held, /health
reports it, and the group comes back; losing a node does the same for every group on it,
which come back on a new node; a peer without the server's secret cannot command an
engine's TCP socket; the actors end with their servers."""

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


_conftest = _load_conftest()
ServerProcess = _conftest.ServerProcess
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
ORPHEUS_LONG = {"temperature": 0.8, "seed": 12, "max_tokens": 240, "ignore_eos": True}


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={**NODE_ARGS, "resources": {"node_a": 2}, "include_dashboard": False})
    c.add_node(**NODE_ARGS, resources={"node_b": 2})
    c.wait_for_nodes()
    yield c
    c.shutdown()


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
def servers(tmp_path_factory, cluster, toy_checkpoint, orpheus_ckpt):
    """The toy and Orpheus, each served with its two groups on the two nodes (started at once)."""
    started: dict[str, object] = {}

    def make(model: str, ckpt, placement: str):
        folder = tmp_path_factory.mktemp(f"{model}-ray")
        (folder / "placement.yaml").write_text(placement)
        args = ["--model", model, "--weights", str(ckpt), "--config", str(folder / "placement.yaml"), "--placement-backend", "ray",
                "--ray-address", cluster.address, "--preprocess-workers", "0", "--shutdown-timeout", "5",
                # Ray sets an actor's OMP threads from its CPUs: one thread everywhere keeps the
                # float reductions (SNAC's audio) bit-equal to the one-process reference.
                "--engine-threads", "1"]
        return ServerProcess(args, folder / "server.log")

    pending = {"toy": make("toy", toy_checkpoint, TOY_PLACEMENT), "orpheus": make("orpheus", orpheus_ckpt, ORPHEUS_PLACEMENT)}

    def start(name: str) -> None:
        try:
            pending[name].start(timeout=420)  # Ray workers start slowly on a busy machine
            started[name] = pending[name]
        except Exception as exc:
            started[name] = exc

    threads = [threading.Thread(target=start, args=(name,)) for name in pending]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for value in started.values():
            if isinstance(value, Exception):
                raise value
        yield pending
        actors = [e["pid"] for srv in pending.values() for e in srv.health().json()["engines"].values()]
        for srv in pending.values():
            assert srv.stop() == 0, srv.log_tail()
        deadline = time.monotonic() + 15
        while any(map(_conftest.running, actors)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(map(_conftest.running, actors)), "engine actors outlived their server"
    finally:
        for srv in pending.values():
            srv.kill_all()


@pytest.fixture(scope="module")
def references(toy_checkpoint, orpheus_ckpt, orpheus_prompt):
    """Outputs of the one-process engine: toy requests, then the two Orpheus ones."""
    toy = _one_process("toy", toy_checkpoint, [([256, *text.encode()], s) for text, s in TOY_REQUESTS])
    orpheus = _one_process("orpheus", orpheus_ckpt, [(orpheus_prompt, ORPHEUS_SAMPLING), (orpheus_prompt, ORPHEUS_LONG)])
    return {"toy": toy, "orpheus": orpheus}


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

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the servers' engines (--engine-threads 1)
    try:
        with Engine.from_model(model, weights=ckpt) as engine:
            outs = engine.run_batch([{"inputs": {"prompt_ids": torch.tensor(p)}, "sampling": s} for p, s in requests])
    finally:
        torch.set_num_threads(threads)
    return [(o.cat("token"), o.cat("audio")) for o in outs]


class _Stream(threading.Thread):
    """A streamed /v1/generate request (NDJSON) read on a thread: its values by signal, its
    last line, and an event set at its first value."""

    def __init__(self, server, model: str, prompt: list[int], sampling: dict) -> None:
        super().__init__()
        self.url, self.body = f"{server.url}/v1/generate", {"model": model, "inputs": {"prompt_ids": prompt}, "sampling": sampling, "stream": True}
        self.first = threading.Event()
        self.values: dict[str, list[torch.Tensor]] = {}
        self.lines: list[dict] = []

    def run(self) -> None:
        import json

        from mstar.api.tensors import tensor_from_json

        try:
            with httpx.stream("POST", self.url, json=self.body, timeout=120) as r:
                for line in r.iter_lines():
                    msg = json.loads(line)
                    self.lines.append(msg)
                    if "signal" in msg:
                        self.values.setdefault(msg["signal"], []).append(tensor_from_json(msg["tensor"], msg["signal"]))
                        self.first.set()
        finally:
            self.first.set()

    def cat(self, signal: str) -> torch.Tensor:
        return torch.cat(self.values[signal])


def test_groups_run_as_actors_on_the_nodes_their_resources_name(servers, cluster):
    head, worker = cluster.head_node.node_id, cluster.worker_nodes.copy().pop().node_id
    for srv, decoder in ((servers["toy"], "decoder_group"), (servers["orpheus"], "snac_group")):
        engines = srv.health().json()["engines"]
        assert {name: e["ray_node_id"] for name, e in engines.items()} == {"lm_group": head, decoder: worker}
        assert all(e["command_addr"].startswith("tcp://") for e in engines.values())


def test_toy_outputs_equal_one_process(servers, references):
    for (text, sampling), (tokens, audio) in zip(TOY_REQUESTS, references["toy"], strict=True):
        got_tokens, got_audio = _outputs(_generate(servers["toy"], "toy", [256, *text.encode()], sampling))
        assert torch.equal(got_tokens, tokens)
        assert torch.equal(got_audio, audio)


def test_orpheus_outputs_equal_one_process(servers, references, orpheus_prompt):
    tokens, audio = references["orpheus"][0]
    assert audio.numel() > 0
    got_tokens, got_audio = _outputs(_generate(servers["orpheus"], "orpheus", orpheus_prompt, ORPHEUS_SAMPLING))
    assert torch.equal(got_tokens, tokens)
    assert torch.equal(got_audio, audio)


def test_a_peer_without_the_secret_cannot_command_an_engine(servers):
    import zmq
    from mstar.server.messages import Shutdown, command_encoder

    toy = servers["toy"]
    engines = toy.health().json()["engines"]
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
    after = toy.health().json()
    assert after["status"] == "ok"
    assert {n: e["pid"] for n, e in after["engines"].items()} == {n: e["pid"] for n, e in engines.items()}
    # One rate-limited line per socket counts its drops (issue 33).
    assert toy.log_tail(400).count("without the server's secret") >= len(engines)
    prompt, sampling = [256, *b"still serving"], {"temperature": 0, "max_tokens": 8}
    assert _outputs(_generate(toy, "toy", prompt, sampling))[0].numel() == 8


def test_killed_actor_fails_only_its_requests_and_comes_back(servers, references, orpheus_prompt):
    """The toy's decoder actor dies (SIGKILL) while a toy request and an Orpheus request
    (whose snac actor shares that node) stream: the toy request fails at once, the Orpheus
    one completes with the one-process output; the toy's group restarts and serves again."""
    toy, orpheus = servers["toy"], servers["orpheus"]
    victim = toy.health().json()["engines"]["decoder_group"]["pid"]
    toy_stream = _Stream(toy, "toy", [256, *b"x"], {"max_tokens": 4000, "ignore_eos": True, "seed": 1})
    orpheus_stream = _Stream(orpheus, "orpheus", orpheus_prompt, ORPHEUS_LONG)
    toy_stream.start()
    assert toy_stream.first.wait(60)
    orpheus_stream.start()
    assert orpheus_stream.first.wait(60)
    assert not any(m.get("finished") for m in orpheus_stream.lines), "the Orpheus request ended before the kill"
    t0 = time.monotonic()
    os.kill(victim, signal.SIGKILL)
    toy_stream.join(30)
    failed_after = time.monotonic() - t0
    health = toy.health().json()
    orpheus_stream.join(120)

    assert toy_stream.lines[-1].get("finish_reason") == "error", toy_stream.lines[-2:]
    assert "decoder_group" in toy_stream.lines[-2]["error"]["message"]
    assert failed_after < 10
    assert health["status"] in ("restarting", "unhealthy") and health["engines"]["decoder_group"]["alive"] is False
    assert "Ray actor died" in health["engines"]["decoder_group"].get("last_exit", "")
    assert orpheus_stream.lines[-1].get("finish_reason") == "length"
    tokens, audio = references["orpheus"][1]
    assert torch.equal(orpheus_stream.cat("token"), tokens) and torch.equal(orpheus_stream.cat("audio"), audio)

    deadline = time.monotonic() + 90
    while toy.health().json()["status"] != "ok":
        assert time.monotonic() < deadline, toy.log_tail()
        time.sleep(0.5)
    back = toy.health().json()["engines"]["decoder_group"]
    assert back["pid"] != victim and back["restarts"] == 1
    (text, sampling), (tokens, audio) = TOY_REQUESTS[0], references["toy"][0]
    got_tokens, got_audio = _outputs(_generate(toy, "toy", [256, *text.encode()], sampling))
    assert torch.equal(got_tokens, tokens) and torch.equal(got_audio, audio)


def test_lost_node_fails_its_requests_and_its_groups_come_back_on_a_new_node(servers, cluster, references, orpheus_prompt):
    """Last: the worker node goes away with both servers' decoder actors (a toy request
    streaming); the toy request fails, both servers report the loss, their LM engines on
    the head live on; a new node with the same resources takes the groups back."""
    toy, orpheus = servers["toy"], servers["orpheus"]
    lm_pids = {name: srv.health().json()["engines"]["lm_group"]["pid"] for name, srv in servers.items()}
    restarts = {name: srv.health().json()["engines"][group]["restarts"] for (name, srv), group in zip(servers.items(), ("decoder_group", "snac_group"), strict=True)}
    stream = _Stream(toy, "toy", [256, *b"y"], {"max_tokens": 4000, "ignore_eos": True, "seed": 2})
    stream.start()
    assert stream.first.wait(60)
    cluster.remove_node(next(iter(cluster.worker_nodes)))
    stream.join(60)
    assert stream.lines[-1].get("finish_reason") == "error", stream.lines[-2:]
    deadline = time.monotonic() + 60
    for (name, srv), group in zip(servers.items(), ("decoder_group", "snac_group"), strict=True):
        while "Ray actor died" not in srv.health().json()["engines"][group].get("last_exit", ""):
            assert time.monotonic() < deadline, srv.log_tail()
            time.sleep(0.5)
        health = srv.health().json()
        assert health["status"] != "ok" and health["engines"]["lm_group"]["pid"] == lm_pids[name]

    node = cluster.add_node(**NODE_ARGS, resources={"node_b": 2})
    deadline = time.monotonic() + 240
    for srv in servers.values():
        while srv.health().json()["status"] != "ok":
            assert time.monotonic() < deadline, srv.log_tail()
            time.sleep(0.5)
    for (name, srv), group in zip(servers.items(), ("decoder_group", "snac_group"), strict=True):
        engine = srv.health().json()["engines"][group]
        assert engine["ray_node_id"] == node.node_id and engine["restarts"] == restarts[name] + 1
    (text, sampling), (tokens, audio) = TOY_REQUESTS[1], references["toy"][1]
    got = _outputs(_generate(toy, "toy", [256, *text.encode()], sampling))
    assert torch.equal(got[0], tokens) and torch.equal(got[1], audio)
    tokens, audio = references["orpheus"][0]
    got = _outputs(_generate(orpheus, "orpheus", orpheus_prompt, ORPHEUS_SAMPLING))
    assert torch.equal(got[0], tokens) and torch.equal(got[1], audio)
