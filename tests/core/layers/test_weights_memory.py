"""Loading a float32 checkpoint into a bfloat16 module holds no second copy of the model.

Measured in a fresh process (``/proc/self/status``):

- anonymous memory (``RssAnon``: what the process needs RAM for), sampled at every torch
  call the load makes, must stay well under the checkpoint's size. Peak RSS (``VmHWM``)
  cannot tell this for a single file: the file's memory-mapped pages count in it as they
  are read, though they are page cache the kernel can drop at any time.
- for a sharded checkpoint, peak RSS itself (reset first through ``/proc/self/clear_refs``)
  must stay well under it too: one shard is mapped at a time.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from mstar.testing.sharding import shard_checkpoint
from safetensors.torch import save_file

pytestmark = pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc/self/status")

TENSORS, ROWS = 16, 2048  # 16 float32 [2048, 2048] tensors: 256 MiB
FLOAT32_MIB = TENSORS * ROWS * ROWS * 4 / 2**20

SCRIPT = r"""
import json, sys
import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from mstar.weights import load_weights

def status():
    return {k: int(v.split()[0]) / 1024 for k, _, v in (line.partition(":") for line in open("/proc/self/status"))
            if k in ("VmHWM", "VmRSS", "RssAnon")}

class PeakAnon(TorchFunctionMode):
    peak = 0.0
    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        PeakAnon.peak = max(PeakAnon.peak, status()["RssAnon"])
        return out

tensors, rows = int(sys.argv[2]), int(sys.argv[3])
module = nn.ParameterDict({f"t{i}": nn.Parameter(torch.zeros(rows, rows, dtype=torch.bfloat16)) for i in range(tensors)})
before = status()
open("/proc/self/clear_refs", "w").write("5")  # VmHWM := VmRSS
with PeakAnon():
    load_weights(module, sys.argv[1])
after = status()
print(json.dumps({"anon_growth": max(PeakAnon.peak, after["RssAnon"]) - before["RssAnon"],
                  "peak_rss_growth": after["VmHWM"] - before["VmRSS"],
                  "first": module["t0"].float().flatten()[:4].tolist()}))
"""


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("weights_memory")
    gen = torch.Generator().manual_seed(0)
    out = {}
    for layout in ("single", "sharded"):
        gen.manual_seed(0)
        (root / layout).mkdir()
        save_file({f"t{i}": torch.randn(ROWS, ROWS, generator=gen) for i in range(TENSORS)}, str(root / layout / "model.safetensors"))
        out[layout] = root / layout
    shard_checkpoint(out["sharded"], 8)
    return out


def _measure(checkpoint: Path) -> dict:
    run = subprocess.run([sys.executable, "-c", SCRIPT, str(checkpoint), str(TENSORS), str(ROWS)],
                         capture_output=True, text=True, timeout=600, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.splitlines()[-1])


def test_single_file_load_adds_no_anonymous_copy(checkpoints: dict[str, Path]) -> None:
    got = _measure(checkpoints["single"])
    # One tensor (16 MiB) in flight at most; a cast copy of the model would add 128 MiB,
    # a float32 one 256 MiB.
    assert got["anon_growth"] < FLOAT32_MIB / 8, got
    want = torch.randn(ROWS, ROWS, generator=torch.Generator().manual_seed(0))[0, :4].bfloat16().float().tolist()
    assert got["first"] == want


def test_sharded_load_peak_rss_stays_near_one_shard(checkpoints: dict[str, Path]) -> None:
    got = _measure(checkpoints["sharded"])
    assert got["anon_growth"] < FLOAT32_MIB / 8, got
    # One 32 MiB shard mapped at a time, plus the tensor in flight.
    assert got["peak_rss_growth"] < FLOAT32_MIB / 4, got
