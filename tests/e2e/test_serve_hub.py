"""``mstar serve ORG/NAME`` from a Hugging Face cache in the real layout, offline: the
plugin comes from the cached config.json, the API uses --served-model-name, outputs equal
a server of the same checkpoint by directory, and the ready line names what runs."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.e2e

HERE = Path(__file__).resolve().parent
COMMIT = "c" * 40


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


hub_cache = _load("hub_cache_e2e", HERE.parent / "fixtures" / "hub_cache.py")
ServerProcess = _load("serve_hub_e2e_server", HERE / "conftest.py").ServerProcess


@pytest.fixture(scope="module")
def hub_env(tmp_path_factory: pytest.TempPathFactory, toy_checkpoint: Path) -> dict[str, str]:
    home = tmp_path_factory.mktemp("hf-home")
    hub_cache.write_snapshot(home, "acme/toy-tiny", toy_checkpoint, COMMIT)
    return {**os.environ, "HF_HOME": str(home), "HF_HUB_OFFLINE": "1"}


@pytest.fixture(scope="module")
def hub_server(tmp_path_factory: pytest.TempPathFactory, hub_env: dict[str, str]):
    srv = ServerProcess(["acme/toy-tiny", "--served-model-name", "tiny", "--served-model-name", "tiny-2", "--preprocess-workers", "1"],
                        tmp_path_factory.mktemp("hub-server") / "server.log", env=hub_env)
    srv.start()
    yield srv
    try:
        srv.stop()
    finally:
        srv.kill_all()


def test_served_names_and_ready_line(hub_server) -> None:
    assert [m["id"] for m in httpx.get(f"{hub_server.url}/v1/models").json()["data"]] == ["tiny"]
    assert httpx.get(f"{hub_server.url}/v1/models/tiny-2").status_code == 200
    missing = httpx.post(f"{hub_server.url}/v1/chat/completions", json={"model": "toy", "messages": [{"role": "user", "content": "x"}]})
    assert missing.status_code == 404 and "'tiny'" in missing.json()["error"]["message"]
    ready = [line for line in hub_server.log_tail(200).splitlines() if line.startswith("mstar serve ready:")]
    assert len(ready) == 1, hub_server.log_tail()
    assert f"models--acme--toy-tiny/snapshots/{COMMIT}" in ready[0]
    assert "model tiny (also tiny-2) [mstar-models-toy" in ready[0]
    assert "placement 0: lm, decoder on cpu" in ready[0]
    assert ready[0].endswith(f"| {hub_server.url}")
    log = hub_server.log_tail(400)  # a log is no terminal: no progress bars in it
    assert "starting engines" not in log and "loading lm weights" not in log and "%|" not in log
    tokens = int(re.search(r"KV capacity lm ([\d,]+) tokens", ready[0]).group(1).replace(",", ""))
    assert tokens == int(hub_server.metric("mstar_kv_blocks_total")) * 16  # the default block size


def test_outputs_equal_the_same_checkpoint_served_by_directory(hub_server, start_server) -> None:
    by_dir = start_server()
    chat = {"messages": [{"role": "user", "content": "Hello hub"}], "max_tokens": 12, "temperature": 0}
    speech = {"input": "Hello hub", "max_tokens": 12, "seed": 3, "response_format": "pcm"}
    a = httpx.post(f"{hub_server.url}/v1/chat/completions", json={"model": "tiny-2", **chat}, timeout=60).json()
    b = httpx.post(f"{by_dir.url}/v1/chat/completions", json={"model": "toy", **chat}, timeout=60).json()
    assert a["model"] == "tiny" and a["choices"][0]["message"] == b["choices"][0]["message"]
    assert a["usage"] == b["usage"]
    sa = httpx.post(f"{hub_server.url}/v1/audio/speech", json={"model": "tiny", **speech}, timeout=60)
    sb = httpx.post(f"{by_dir.url}/v1/audio/speech", json={"model": "toy", **speech}, timeout=60)
    assert sa.status_code == sb.status_code == 200 and len(sa.content) > 0 and sa.content == sb.content


def test_uncached_repo_offline_fails_in_one_line(hub_env: dict[str, str]) -> None:
    proc = subprocess.run([sys.executable, "-m", "mstar.cli", "serve", "acme/not-cached"], env=hub_env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "acme/not-cached" in lines[0] and "HF_HUB_OFFLINE" in lines[0], proc.stderr
