"""A replicated placement (docs/serving.md, replicas) on Qwen3-Omni's tiny checkpoint: the Thinker group (Thinker and
both encoders, one partition) runs as two replicas, the Talker and Code2Wav in a third
process, and a routing plugin (tests/fixtures/plugins/route_modality, pip-installed) sends
spoken requests to one Thinker replica and text-only ones to the other."""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from omni_server import omni_server

pytestmark = pytest.mark.e2e

ROUTE_PLUGIN = Path(__file__).resolve().parents[1] / "fixtures" / "plugins" / "route_modality"
PIP = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input", "-q"]
PLACEMENT = """
groups:
  thinker: {device: cpu, nodes: [thinker, audio_encoder, vision_encoder], replicas: 2}
  speech: {device: cpu, nodes: [talker, code2wav]}
"""
MESSAGES = [{"role": "user", "content": "Tell me about the sea."}]
TEXT = {"model": "qwen3omni", "messages": MESSAGES, "max_tokens": 8, "temperature": 0}
SPEECH = {**TEXT, "modalities": ["text", "audio"], "audio": {"voice": "Ethan", "format": "pcm16"},
          "seed": 5, "sampling": {"nodes": {"talker": {"max_tokens": 12}}}}


def pip(args: list[str]) -> None:
    proc = subprocess.run([*PIP, *args], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("qwen3omni-replicas")
    src = root / "src"  # a copy: setuptools' build/ and egg-info never litter the repo
    shutil.copytree(ROUTE_PLUGIN, src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    pip(["wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", str(root / "wheels"), str(src)])
    pip(["install", "--no-deps", "--no-index", "--target", str(root / "site"), *map(str, (root / "wheels").glob("*.whl"))])
    (root / "placement.yaml").write_text(PLACEMENT)
    path = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), str(root / "site")) if p)
    args = ["--config", str(root / "placement.yaml"), "--preprocess-workers", "0", "--engine-threads", "1"]
    with omni_server(args, root / "server.log", env={"PYTHONPATH": path}) as url:
        yield url


def requests_of(url: str, engine: str, replica: int) -> float:
    want = f'engine="{engine}"', f'replica="{replica}"'
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith("mstar_engine_requests{") and all(w in line for w in want):
            return float(line.rsplit(" ", 1)[1])
    raise KeyError(f"no mstar_engine_requests for {engine}/{replica}")


def counts(url: str) -> list[float]:
    return [requests_of(url, "thinker", 0), requests_of(url, "thinker", 1), requests_of(url, "speech", 0)]


def settled(url: str, want: list[float], timeout: float = 10.0) -> list[float]:
    deadline = time.monotonic() + timeout
    while (got := counts(url)) != want and time.monotonic() < deadline:
        time.sleep(0.05)
    return got


def test_speech_and_text_go_to_their_own_thinker_replica(server):
    engines = httpx.get(f"{server}/health", timeout=10).json()["engines"]
    assert {name: (e["group"], e["replica"]) for name, e in engines.items()} == {
        "thinker/0": ("thinker", 0), "thinker/1": ("thinker", 1), "speech": ("speech", 0),
    }
    before = counts(server)
    text = httpx.post(f"{server}/v1/chat/completions", json=TEXT, timeout=300)
    assert text.status_code == 200, text.text
    spoken = []
    for _ in range(3):
        r = httpx.post(f"{server}/v1/chat/completions", json=SPEECH, timeout=300)
        assert r.status_code == 200, r.text
        spoken.append(r.json()["choices"][0]["message"]["audio"])
    # One at a time, the default policy would have put all four on replica 0.
    assert settled(server, [before[0] + 1, before[1] + 3, before[2] + 3]) == [before[0] + 1, before[1] + 3, before[2] + 3]
    assert all(base64.b64decode(a["data"]) for a in spoken)
    assert len({a["data"] for a in spoken}) == 1  # seeded: the same bytes every time
    # Both replicas hold the same Thinker: greedy text is the same through either.
    assert spoken[0]["transcript"] == text.json()["choices"][0]["message"]["content"]
