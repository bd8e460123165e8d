"""``mstar serve --config tp2.yaml``: the text LM fixture's group run as two tensor-parallel
ranks (two processes, gloo), over HTTP equal to transformers greedy; a follower rank killed
mid-request fails the request with an error, the group restarts as a unit and serves the
same answer again; beside it, another model's group keeps serving throughout."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import openai
import pytest
import torch
from conftest import ServerProcess, descendants, with_site

pytestmark = pytest.mark.e2e
transformers = pytest.importorskip("transformers")
FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "plugins" / "qwen3_text"
PIP = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input", "-q"]
PROMPT = [11, 52, 7, 300, 44, 9]
TOKENS = 12


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tp-site")
    shutil.copytree(FIXTURE, root / "src", ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))

    def pip(*args: object) -> None:
        proc = subprocess.run([*PIP, *map(str, args)], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr

    pip("wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", root / "wheels", root / "src")
    pip("install", "--no-deps", "--no-index", "--target", root / "site", *(root / "wheels").glob("*.whl"))
    return root / "site"


@pytest.fixture(scope="module")
def ckpt(site: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    sys.path.insert(0, str(site))
    try:
        from fixture_qwen3.plugin import write_tiny_checkpoint
    finally:
        sys.path.remove(str(site))
    path = tmp_path_factory.mktemp("tp-ckpt")
    write_tiny_checkpoint(path)
    return path


@pytest.fixture(scope="module")
def expected(ckpt: Path) -> list[int]:
    hf = transformers.Qwen3ForCausalLM.from_pretrained(ckpt).eval()
    with torch.no_grad():
        out = hf.generate(torch.tensor([PROMPT]), attention_mask=torch.ones(1, len(PROMPT), dtype=torch.long),
                          max_new_tokens=TOKENS, min_new_tokens=TOKENS, do_sample=False, pad_token_id=0)
    return out[0, len(PROMPT):].tolist()


@pytest.fixture(scope="module")
def server(site: Path, ckpt: Path, tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("tp-server")
    (folder / "tp2.yaml").write_text("groups:\n  lm: {device: cpu, nodes: [lm], tensor_parallel: 2}\n")
    yield from _serve(["--model", "tinyqwen3", "--weights", str(ckpt), "--config", str(folder / "tp2.yaml"),
                       "--preprocess-workers", "1"], folder, site)


def _serve(args: list[str], folder: Path, site: Path):
    """A server with ``args`` (its log in ``folder``), stopped after the module's tests."""
    srv = ServerProcess(args, folder / "server.log", env=with_site(site, OMP_NUM_THREADS="1"))
    srv.start(timeout=300)
    yield srv
    try:
        srv.stop()
    finally:
        srv.kill_all()


def generate(server: ServerProcess, max_tokens: int = TOKENS) -> list[int]:
    import httpx
    from mstar.api.tensors import tensor_from_json

    body = {"model": "tinyqwen3", "inputs": {"prompt_ids": PROMPT}, "signals": ["tokens"],
            "sampling": {"temperature": 0, "max_tokens": max_tokens, "ignore_eos": True}}
    r = httpx.post(f"{server.url}/v1/generate", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return tensor_from_json(r.json()["outputs"]["tokens"], "tokens").reshape(-1).tolist()


def follower_pid(server: ServerProcess) -> int:
    for pid in descendants(server.proc.pid):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"mstar.server.tensor_parallel_ranks" in cmd:
            return pid
    raise AssertionError("no tensor-parallel follower process")


def test_two_ranks_serve_what_transformers_generates(server, expected) -> None:
    log = server.log_path.read_text()
    assert "rank 1 of 2 ready on cpu" in log and "(rank 0 of 2)" in log, log[-3000:]
    assert generate(server) == expected


def test_a_killed_rank_fails_its_request_and_the_group_restarts(server, expected) -> None:
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=60)
    old = follower_pid(server)
    stream = client.completions.create(model="tinyqwen3", prompt=PROMPT, max_tokens=400, temperature=0,
                                       stream=True, extra_body={"ignore_eos": True})
    next(iter(stream))
    os.kill(old, signal.SIGKILL)
    with pytest.raises(openai.APIError) as err:  # the in-flight request ends with an error event
        for _ in stream:
            pass
    assert not isinstance(err.value, openai.APIConnectionError)
    deadline = time.monotonic() + 120  # the failure reaches the server, then the group restarts
    while time.monotonic() < deadline and (server.health().status_code != 200
                                           or server.health().json()["engines"]["lm"]["restarts"] < 1):
        time.sleep(0.2)
    health = server.health().json()
    assert health["status"] == "ok", server.log_tail()
    assert health["engines"]["lm"]["restarts"] == 1
    assert "GroupFailure" in health["engines"]["lm"]["last_exit"] or "collective failed" in server.log_tail(200)
    assert follower_pid(server) != old
    assert generate(server) == expected


@pytest.fixture(scope="module")
def two_models(site: Path, ckpt: Path, tmp_path_factory: pytest.TempPathFactory):
    """The same checkpoint served twice: "tp" on two ranks, "single" on one device."""
    folder = tmp_path_factory.mktemp("tp-two-models")
    (folder / "tp2.yaml").write_text("groups:\n  lm: {device: cpu, nodes: [lm], tensor_parallel: 2}\n")
    (folder / "models.yaml").write_text(
        "models:\n"
        f"  - {{model: tinyqwen3, weights: {ckpt}, served_model_names: [tp], placement: tp2.yaml, preprocess_workers: 0}}\n"
        f"  - {{model: tinyqwen3, weights: {ckpt}, served_model_names: [single], preprocess_workers: 0}}\n"
    )
    yield from _serve(["--models-config", str(folder / "models.yaml")], folder, site)


def test_other_groups_keep_serving_while_a_tensor_parallel_group_fails(two_models, expected) -> None:
    import httpx

    client = openai.OpenAI(base_url=f"{two_models.url}/v1", api_key="unused", max_retries=0, timeout=60)
    long = {"prompt": PROMPT, "max_tokens": 300, "temperature": 0, "stream": True, "extra_body": {"ignore_eos": True}}
    old = follower_pid(two_models)
    doomed = client.completions.create(model="tp", **long)
    beside = client.completions.create(model="single", **long)
    next(iter(doomed))
    first = next(iter(beside))
    os.kill(old, signal.SIGKILL)
    with pytest.raises(openai.APIError):
        for _ in doomed:
            pass
    # The other model's request, running when the rank died, goes on to its end.
    text = first.choices[0].text + "".join(chunk.choices[0].text for chunk in beside if chunk.choices)
    assert client.completions.create(model="single", prompt=PROMPT, max_tokens=300, temperature=0,
                                     extra_body={"ignore_eos": True}).choices[0].text == text
    # And it answers new requests, exactly, while the failed group restarts.
    served_during = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        tp = httpx.get(f"{two_models.url}/health", params={"model": "tp"}, timeout=10)
        if tp.status_code == 200 and tp.json()["engines"]["lm"]["restarts"] >= 1:
            break
        got = client.completions.create(model="single", prompt=PROMPT, max_tokens=TOKENS, temperature=0,
                                        extra_body={"ignore_eos": True})
        served_during.append(got.choices[0].text)
    health = httpx.get(f"{two_models.url}/health", timeout=10).json()
    assert health["models"]["tp"]["engines"]["lm"]["restarts"] == 1, two_models.log_tail()
    assert all(e["restarts"] == 0 for e in health["models"]["single"]["engines"].values())
    assert served_during, "the group restarted before a request could be sent beside it"
    assert len(set(served_during)) == 1  # the same greedy answer every time
    assert follower_pid(two_models) != old
    assert generate_on(two_models, "tp") == expected == generate_on(two_models, "single")


def generate_on(server: ServerProcess, model: str) -> list[int]:
    import httpx
    from mstar.api.tensors import tensor_from_json

    body = {"model": model, "inputs": {"prompt_ids": PROMPT}, "signals": ["tokens"],
            "sampling": {"temperature": 0, "max_tokens": TOKENS, "ignore_eos": True}}
    r = httpx.post(f"{server.url}/v1/generate", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return tensor_from_json(r.json()["outputs"]["tokens"], "tokens").reshape(-1).tolist()
